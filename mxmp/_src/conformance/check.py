""":func:`check_kernels`: choose the ops, run each in a process forked by the zygote of
:mod:`.run`, collect the rows into a :class:`KernelReport` (docs/conformance.md).
"""
import concurrent.futures
import json
import signal
import threading

from ..cpu_tier import tier_info
from ..policy.policy import Policy
from ..dtypes import normalize_dtype
from ..policy.kernel_report import KernelReport, machine_info
from ..policy.tables import aliases as table_aliases
from ..graph.kernel_rule import SUBSTITUTES
from .cases import CASES, NOT_TESTED
from .run import _CASE_NAMES, _TESTED_CLASSES, _row, _Zygote, cases_of, has_params, tolerances


def _ops_to_test(policy, ops):
    """[(op, class, params only)] of the canonical ops to run, and {alias: canonical} of the
    lists. By default the ops of the tested classes, all cases, and the other ops whose case
    has parameters, in the ``lp-params`` case only (a float32 op fed low-precision weights)."""
    aliases = table_aliases(policy.target_dtype)
    if ops is None:
        chosen = sorted({aliases.get(o, o) for c in _TESTED_CLASSES for o in policy.ops_in(c)})
        extra = sorted(op for op in CASES if op not in chosen and
                       (has_params(op) or op in SUBSTITUTES))
    else:
        if isinstance(ops, str):
            raise ValueError('ops must be a list of op names, not the string %r' % ops)
        Policy(policy.target_dtype, fp32_ops=ops)  # validates the names
        chosen, extra = list(dict.fromkeys(ops)), []
    return [(op, policy.classify(op)[0], op in extra) for op in chosen + extra], aliases


def check_kernels(target_dtype='bfloat16', ops=None, emulate=None, policy=None, jobs=2,
                  timeout=90.0, seeds=(0, 1, 2), progress=None, cases=None):
    """Run the conformance suite on this machine (docs/conformance.md).

    Args:
        target_dtype (str): ``'bfloat16'`` (default) or ``'float16'`` (emulated on a CPU).
        ops (list of str): op names to test; an op the policy keeps in float32 is tested as if
            ``lp_ops=[op]``. Default: every canonical op of the policy's LOW_PRECISION, FOLLOW
            and WIDEST_TYPE classes, and the float32 ops with parameters in ``lp-params`` only.
        emulate (bool or None): True emulated graphs only, False real graphs only, None
            (default) real, emulated where oneDNN has no kernel on this CPU.
        policy (mxmp.Policy): whose classes are tested; default ``Policy(target_dtype)``.
        jobs (int): subprocesses at once, >= 1 (default 2).
        timeout (float): seconds an op's subprocess may take (then ``crash(hang)``); 90.
        seeds (tuple of int): seeds of inputs and head gradients; a case reports its largest
            errors over them. Default (0, 1, 2).
        progress (callable): called with each finished row (a dict).
        cases (iterable of str): only these of ``'lp-input'``, ``'cast'``, ``'lp-params'``.

    Returns:
        mxmp.KernelReport

    Raises:
        ValueError: unknown dtype, op or case; ``policy`` of another dtype; ``jobs < 1``.
    """
    target = normalize_dtype(target_dtype)
    policy = policy if policy is not None else Policy(target)
    if policy.target_dtype != target:
        raise ValueError('policy.target_dtype=%r disagrees with target_dtype=%r'
                         % (policy.target_dtype, target))
    if cases is not None:
        cases = (cases,) if isinstance(cases, str) else tuple(cases)
        if set(cases) - set(_CASE_NAMES):
            raise ValueError('cases must be a list of %s, got %r' % (', '.join(_CASE_NAMES),
                                                                      cases))
    if int(jobs) < 1:
        raise ValueError('jobs must be >= 1, got %r' % (jobs,))
    if target == 'float16':
        emulate = True  # no float16 Convolution/FullyConnected on a CPU
    todo, aliases = _ops_to_test(policy, ops)
    if any(op in SUBSTITUTES for op, _, _ in todo):
        # build mxmp's operator library here, once, not in a child under its timeout
        from ..kernels.build import load_library
        load_library()
    info = dict(machine_info(target), **tier_info(target))
    rows, local, zygotes = [], threading.local(), []

    def execute(job, limit):  # one zygote per worker thread, started on first use
        if not hasattr(local, 'zygote'):
            local.zygote = _Zygote()
            zygotes.append(local.zygote)
        return local.zygote(job, limit)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(int(jobs), len(todo) or 1)) as pool:
            futures = [pool.submit(_run_op, op, cls, policy, emulate, timeout, seeds, execute,
                                   only, cases) for op, cls, only in todo]
            for fut in futures:
                for row in fut.result():
                    rows.append(row)
                    if progress is not None:
                        progress(row)
    finally:
        for z in zygotes:
            z.close()
    fwd, bwd = tolerances(target)
    return KernelReport(target_dtype=target, machine=info, rows=rows,
                        tolerances={'forward': fwd, 'backward': bwd},
                        aliases=dict(aliases))


def _signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return 'signal %d' % -rc


def _run_op(op, cls, policy, emulate, timeout, seeds, execute, params_only, cases):
    """All cases of one op (``params_only``: its ``lp-params`` cases; ``cases``: only these, or
    None), in subprocesses; a crash ends that case, the rest run anew."""
    if op not in CASES:
        reason = NOT_TESTED.get(op, 'no input spec in mxmp/_src/conformance/cases.py')
        return [_row(op, cls, '', '', detail=reason)]
    pending = [p for p in cases_of(op, params_only) if cases is None or p[1] in cases]
    order = {p: i for i, p in enumerate(pending)}
    rows = []
    while pending:
        job = {'op': op, 'class': cls, 'cases': pending, 'seeds': list(seeds),
               'emulate': emulate,
               'target_dtype': policy.target_dtype, 'lp_ops': sorted(policy.lp_ops),
               'fp32_ops': sorted(policy.fp32_ops)}
        out, err, rc = execute(job, timeout)
        started, done = None, set()
        for line in out.splitlines():
            if not line.startswith('{'):
                continue
            msg = json.loads(line)
            if 'start' in msg:
                started = tuple(msg['start'])
            else:
                rows.append(msg)
                done.add((msg['variant'], msg['case']))
        pending = [p for p in pending if p not in done]
        if not pending and rc == 0:
            break
        lines = [ln for ln in err.strip().splitlines()
                 if ln.strip() and 'Subgraph backend' not in ln]
        tail = ' | '.join(lines[-3:])[-400:]
        if rc is None:
            verdict = 'crash(hang)'
            tail = 'hung: stopped after %g s' % timeout
        elif rc < 0:
            verdict = 'crash(%s)' % _signal_name(rc)
        elif 'Segmentation fault' in err:  # MXNet's own SIGSEGV handler exits with rc > 0
            verdict = 'crash(SIGSEGV)'
        else:
            verdict = 'error'
        if started is None or started not in pending:
            # died before its first case or after its last (e.g. heap checks at exit)
            for r in rows:
                if r['verdict'] == 'ok':
                    r['verdict'] = verdict
                    r['detail'] = 'process ended with %s after the case: %s' % (
                        _signal_name(rc) if rc and rc < 0 else 'exit code %s' % rc, tail)
            for v, c in pending:
                rows.append(_row(op, cls, v, c, verdict=verdict, detail=tail))
            break
        rows.append(_row(op, cls, started[0], started[1], verdict=verdict, detail=tail,
                         mode='real' if emulate is not True else 'emulated'))
        pending = [p for p in pending if p != started]
    rows.sort(key=lambda r: order.get((r['variant'], r['case']), -1))
    return rows

