"""Kernel conformance suite: does every op the policy runs in low precision compute correctly here?

:func:`check_kernels` takes every op that a :class:`~mxmp.Policy` lets compute in the target
dtype (classes LOW_PRECISION, FOLLOW and WIDEST_TYPE; aliases share their canonical op's
kernel and are covered by it), builds a one-op graph at realistic sizes
(:mod:`mxmp.conformance_cases`), converts it with :func:`mxmp.convert_symbol`, runs it forward
and backward, and compares with the float32 graph run on the same rounded inputs and the same
rounded head gradients. Two cases per op and attribute variant:

``lp-input``  the op's float data arrives in the target dtype (from a low-precision producer:
              the converted graph's data inputs are declared low precision); weights and
              BatchNorm parameters arrive float32 and the pass casts them.
``cast``      every input arrives float32 and the pass casts it (``Policy(lp_ops=[op])`` for
              ops that are not LOW_PRECISION already): how weights arrive.

Each op runs in its own Python subprocess, so a kernel that corrupts memory fails that op
only: a negative return code is reported as the signal (``crash(SIGABRT)``) with the last lines
MXNet or glibc wrote to stderr. MXNet 1.9.1's bfloat16 ``transpose`` is such an op.

Modes: ``real`` runs the converted graph as it is: with oneDNN's bfloat16 kernels where the CPU
has them (avx512_bf16, AMX), with MXNet's generic bfloat16 kernels (elementwise, shape, gather)
everywhere. ``emulated`` runs the emulated graph (float32 kernels, values rounded through the
target dtype, see :mod:`mxmp.graph`). By default (``emulate=None``) a case runs ``real`` and,
when the CPU lacks the oneDNN kernels, falls back to ``emulated`` where the real graph fails
with oneDNN's "could not create a primitive descriptor". float16 on a CPU is always emulated.

Error measure (per output or gradient, the worst one reported): ``max|y - y32| / max|y32|``
(``max|y|`` when the reference is all zero). Tolerances come from the dtype's machine epsilon
``eps`` (bfloat16 2^-7, float16 2^-10): forward ``eps`` (two unit roundoffs: the rounding of
the output and one of the op's own arithmetic), backward ``2 * eps`` (the head gradient is
rounded as well). On real avx512_bf16 kernels the ops of issue 11 measured forward <= 0.0032
and backward <= 0.005 against these 0.0078 and 0.0156.
"""
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np

from .conformance_cases import CASES, NOT_TESTED, canonical_ops
from .kernel_report import KernelReport, machine_info
from .policy import FLOAT32, FOLLOW, LOW_PRECISION, WIDEST_TYPE, Policy, normalize_dtype

__all__ = ['check_kernels', 'EPS', 'tolerances']

#: Machine epsilon (spacing of 1.0 and the next value) of each target dtype.
EPS = {'bfloat16': 2.0 ** -7, 'float16': 2.0 ** -10}
_CASE_NAMES = ('lp-input', 'cast')
_TESTED_CLASSES = (LOW_PRECISION, FOLLOW, WIDEST_TYPE)


def tolerances(target_dtype):
    """``(forward, backward)`` relative-error bounds for ``target_dtype`` (module docstring)."""
    eps = EPS[normalize_dtype(target_dtype)]
    return eps, 2 * eps


# ---------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------
def _ops_to_test(policy, ops):
    """[(op, class)] of the canonical ops to run, and {alias: canonical} of the lists."""
    from . import lists
    aliases = canonical_ops(lists._MODULES[policy.target_dtype])
    if ops is None:
        chosen = sorted({aliases.get(o, o) for c in _TESTED_CLASSES for o in policy.ops_in(c)})
    else:
        if isinstance(ops, str):
            raise ValueError('ops must be a list of op names, not the string %r' % ops)
        Policy(policy.target_dtype, fp32_ops=ops)  # validates the names
        chosen = list(dict.fromkeys(ops))
    out = []
    for op in chosen:
        cls, _ = policy.classify(op)
        out.append((op, cls))
    return out, aliases


def check_kernels(target_dtype='bfloat16', ops=None, emulate=None, policy=None, jobs=2,
                  timeout=90.0, seeds=(0, 1, 2), progress=None):
    """Run the conformance suite on this machine.

    Args:
        target_dtype (str): ``'bfloat16'`` (default) or ``'float16'`` (emulated on a CPU).
        ops (list of str): op names to test (any registered op; an op the policy keeps in
            float32 is tested as if ``lp_ops=[op]``, to gather evidence for widening). Default:
            every canonical op of the policy's LOW_PRECISION, FOLLOW and WIDEST_TYPE classes.
        emulate (bool or None): ``True`` emulated graphs only, ``False`` real graphs only (a
            missing kernel is then an error), ``None`` (default) real, falling back to emulated
            where oneDNN has no kernel on this CPU.
        policy (mxmp.Policy): the policy whose classes are tested; default ``Policy(target_dtype)``.
        jobs (int): subprocesses run at once (default 2).
        timeout (float): seconds one op's subprocess may take before it is stopped (verdict
            ``error``).
        seeds (tuple of int): seeds of the input values and head gradients; every case runs
            once per seed and reports its largest errors (default three: verdicts rest on the
            spread, not on one draw).
        progress (callable): called with each finished row (a dict), e.g. to print it.

    Returns:
        mxmp.kernel_report.KernelReport: the rows (op, class, variant, case, mode, forward and
        backward error, verdict ``ok``/``wrong``/``crash(SIG...)``/``error``/``not-tested``,
        detail) and the machine (CPU model and flags, MXNet version, real kernels or not, date).

    Raises:
        ValueError: unknown dtype or op name; ``jobs < 1``.
    """
    target = normalize_dtype(target_dtype)
    policy = policy if policy is not None else Policy(target)
    if policy.target_dtype != target:
        raise ValueError('policy.target_dtype=%r disagrees with target_dtype=%r'
                         % (policy.target_dtype, target))
    if int(jobs) < 1:
        raise ValueError('jobs must be >= 1, got %r' % (jobs,))
    if target == 'float16':
        emulate = True  # no float16 Convolution/FullyConnected on a CPU
    todo, aliases = _ops_to_test(policy, ops)
    info = machine_info(target)
    rows, local, zygotes = [], threading.local(), []

    def execute(job, limit):  # one zygote per worker thread, started on first use
        if not hasattr(local, 'zygote'):
            local.zygote = _Zygote()
            zygotes.append(local.zygote)
        return local.zygote(job, limit)

    def run(op, cls):
        return _run_op(op, cls, policy, emulate, timeout, seeds, execute)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(int(jobs), len(todo) or 1)) as pool:
            futures = [pool.submit(run, op, cls) for op, cls in todo]
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
                        aliases={a: c for a, c in aliases.items()})


def _env():
    env = dict(os.environ)
    env.setdefault('OMP_NUM_THREADS', '1')
    env['LIBC_FATAL_STDERR_'] = '1'  # glibc's "corrupted size vs. prev_size" to stderr, not tty
    return env


class _Zygote:
    """A Python process that imports MXNet once and forks one child per op.

    Importing MXNet takes 2 s of CPU (12 s of wall time on a loaded 2-core machine); a fork
    takes milliseconds. The forked child has its own copy of the heap, so a kernel that
    corrupts it kills that child only; the zygote reports its exit status or signal.
    """

    def __init__(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix='mxmp-check-kernels-')
        self.proc = subprocess.Popen([sys.executable, '-m', 'mxmp.conformance', '--serve'],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=_env(), text=True)

    def __call__(self, job, timeout):
        job = dict(job, timeout=timeout, stdout=os.path.join(self.dir, 'out'),
                   stderr=os.path.join(self.dir, 'err'))
        self.proc.stdin.write(json.dumps(job) + '\n')
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError('the check-kernels zygote process ended (exit code %s)'
                               % self.proc.poll())
        rc = json.loads(line)['rc']
        with open(job['stdout']) as fo, open(job['stderr'], errors='replace') as fe:
            return fo.read(), fe.read(), rc

    def close(self):
        import shutil
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _serve():
    """Zygote loop (``python -m mxmp.conformance --serve``): one job per stdin line."""
    import time
    import traceback
    import mxnet  # noqa: F401  pylint: disable=unused-import
    from . import graph  # noqa: F401  pylint: disable=unused-import
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd, path in ((1, job['stdout']), (2, job['stderr'])):
                    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
                _child(job)
                code = 0
            except BaseException:  # pylint: disable=broad-except
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # pylint: disable=protected-access
        deadline = time.time() + job['timeout']
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.time() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = None
                break
            time.sleep(0.02)
        rc = None if status is None else (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                                          else os.WEXITSTATUS(status))
        print(json.dumps({'rc': rc}), flush=True)


def _row(op, cls, variant, case, **kw):
    row = {'op': op, 'class': cls, 'variant': variant, 'case': case, 'mode': None,
           'fwd_err': None, 'bwd_err': None, 'verdict': 'not-tested', 'detail': ''}
    row.update(kw)
    return row


def _signal_name(rc):
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return 'signal %d' % -rc


def _run_op(op, cls, policy, emulate, timeout, seeds, execute):
    """All cases of one op, in subprocesses; a crash ends that case, the rest run anew."""
    if op not in CASES:
        reason = NOT_TESTED.get(op, 'no input spec in mxmp/conformance_cases.py')
        return [_row(op, cls, '', '', detail=reason)]
    pending = [(v, c) for v, _, _ in CASES[op] for c in _CASE_NAMES]
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
                if r['op'] == op and r['verdict'] == 'ok':
                    r['verdict'] = verdict
                    r['detail'] = 'process ended with %s after the case: %s' % (
                        _signal_name(rc) if rc and rc < 0 else 'exit code %s' % rc, tail)
            for v, c in pending:
                rows.append(_row(op, cls, v, c, verdict=verdict, detail=tail))
            break
        rows.append(_row(op, cls, started[0], started[1], verdict=verdict, detail=tail,
                         mode='real' if emulate is not True else 'emulated'))
        pending = [p for p in pending if p != started]
    order = {(v, c): i for i, (v, c) in enumerate((v, c) for v, _, _ in CASES[op]
                                                 for c in _CASE_NAMES)}
    rows.sort(key=lambda r: order.get((r['variant'], r['case']), -1))
    return rows


def cmd(args):
    """``mxmp check-kernels`` (arguments from :func:`mxmp.cli.build_parser`); returns the exit code."""
    ops = [o.strip() for o in args.ops.split(',') if o.strip()] if args.ops else None
    emulate = {'auto': None, 'yes': True, 'no': False}[args.emulate]
    report = check_kernels(args.dtype, ops=ops, emulate=emulate, jobs=args.jobs,
                           timeout=args.timeout)
    print(report.table())
    if args.out:
        report.save(args.out)
        print('report written to %s; use it with mxmp.Policy.from_kernel_report(%r)'
              % (args.out, args.out))
    bad = [op for op, v in report.verdicts().items() if v.split('(')[0] in ('wrong', 'crash',
                                                                              'error')]
    return 4 if bad else 0


# ---------------------------------------------------------------------------------------------
# Child side: runs in ``python -m mxmp.conformance JOB``
# ---------------------------------------------------------------------------------------------
def _values(rng, shape, kind):
    if kind in ('n', 'w'):
        return rng.normal(size=shape)
    if kind in ('p', 'g', 'a'):
        return rng.uniform(0.5, 2.0, size=shape)
    if kind == 'c':
        return rng.uniform(1.5, 3.0, size=shape)
    if kind == 'm':
        return (rng.uniform(size=shape) < 0.5).astype(np.float64)
    n = int(kind[1:])
    if kind[0] in 'iI':
        return rng.randint(0, n, size=shape)
    if kind[0] == 'l':
        return rng.randint(1, n + 1, size=shape)
    if kind[0] == 's':
        flat = rng.choice(n * n, size=shape[1], replace=False)
        return np.stack([flat // n, flat % n])
    raise ValueError('unknown input kind %r' % kind)


def _op_fn(op):
    import mxnet as mx
    for mod, name in ((mx.sym, op), (mx.sym._internal, op),
                      (mx.sym.contrib, op[len('_contrib_'):])):
        fn = getattr(mod, name, None)
        if fn is not None:
            return fn
    raise ValueError('mx.sym has no function for %s' % op)


def _rel_err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = np.max(np.abs(ref)) if ref.size else 0.0
    if not np.all(np.isfinite(got)):
        return float('inf')
    diff = np.max(np.abs(got - ref)) if ref.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def _to_np(arr):
    import mxnet as mx
    if arr.dtype not in (np.float16, np.float32, np.float64) and \
            getattr(np.dtype(arr.dtype), 'names', None):
        arr = mx.nd.amp_cast(arr, dtype='float32')
    return arr.asnumpy()


def _run(sym, arrays, aux, grad_names, head_grads):
    """Forward (training mode) and backward of a bound ``sym``; float64 numpy results."""
    import mxnet as mx
    exe = sym.bind(mx.cpu(), args=arrays, aux_states=aux,
                   args_grad={n: arrays[n].zeros_like() for n in grad_names},
                   grad_req={n: ('write' if n in grad_names else 'null') for n in arrays})
    outs = exe.forward(is_train=True)
    fwd = [_to_np(o) for o in outs]
    grads = []
    if head_grads is not None:
        exe.backward([mx.nd.array(h, dtype=o.dtype) for h, o in zip(head_grads, outs)])
        grads = [_to_np(exe.grad_dict[n]) for n in grad_names]
    mx.nd.waitall()
    return fwd, grads


def _round(values, target):
    import mxnet as mx
    from .gluon import dtype_of
    return mx.nd.amp_cast(mx.nd.amp_cast(mx.nd.array(values), dtype=dtype_of(target)),
                          dtype='float32').asnumpy()


def _child(job):
    from .device import MISSING_KERNEL_MESSAGE, lp_kernels_available
    target = job['target_dtype']
    op, cls = job['op'], job['class']
    base = Policy(target, lp_ops=job['lp_ops'], fp32_ops=job['fp32_ops'])
    emulate = job['emulate']
    real_possible = target == 'bfloat16' and lp_kernels_available('bfloat16')
    specs = {v: (inputs, attrs) for v, inputs, attrs in CASES[op]}
    fault = os.environ.get('MXMP_CONFORMANCE_FAULT', '').partition('=')
    for variant, case in job['cases']:
        print(json.dumps({'start': [variant, case]}), flush=True)
        if fault[0] == op:  # test hook: this op's process dies as a corrupted heap makes it
            os.kill(os.getpid(), getattr(signal, fault[2]))
        inputs, attrs = specs[variant]
        modes = ['emulated'] if emulate is True else ['real']
        if emulate is None and not real_possible:
            modes.append('emulated')
        row = _row(op, cls, variant, case)
        for mode in modes:
            try:
                errs = [_measure(op, cls, inputs, attrs, case, base, target, mode, seed)
                        for seed in job['seeds']]
            except Exception as exc:  # pylint: disable=broad-except
                if mode == 'real' and len(modes) > 1 and MISSING_KERNEL_MESSAGE in str(exc):
                    continue
                row.update(mode=mode, verdict='error', detail='%s: %s'
                           % (type(exc).__name__, _first_line(exc)))
                break
            fe = max(e[0] for e in errs)
            be = None if errs[0][1] is None else max(e[1] for e in errs)
            ftol, btol = tolerances(target)
            bad = [what for what, e, t in (('forward', fe, ftol), ('backward', be, btol))
                   if e is not None and not e <= t]
            notes = ['%s error above tolerance' % ' and '.join(bad)] if bad else []
            if mode == 'emulated' and len(modes) > 1:
                notes.append('no oneDNN %s kernel on this CPU: emulated' % target)
            notes += [errs[0][2]] if errs[0][2] else []
            row.update(mode=mode, fwd_err=fe, bwd_err=be, verdict='wrong' if bad else 'ok',
                       detail='; '.join(notes))
            break
        print(json.dumps(row), flush=True)


def _measure(op, cls, inputs, attrs, case, base, target, mode, seed):
    """Forward and backward relative errors of one case (see the module docstring)."""
    import mxnet as mx
    from .graph import convert_symbol
    from .gluon import dtype_of
    rng = np.random.RandomState(seed)
    names = ['in%d' % i for i in range(len(inputs))]
    sym = _op_fn(op)(*[mx.sym.var(n) for n in names], name='op', **attrs)
    index_pos = set(base.index_inputs(op)) | {i for i, (_, k) in enumerate(inputs)
                                              if k[0] in 'iIls'}
    aux_names = set(sym.list_auxiliary_states())
    values = {}
    for i, ((shape, kind), n) in enumerate(zip(inputs, names)):
        v = _values(rng, shape, kind)
        values[n] = v if i in index_pos else _round(v, target)
    dtypes = {n: ('int32' if k[0] == 'I' else 'float32')
              for n, (_, k) in zip(names, inputs)}
    float_in = [n for i, n in enumerate(names) if i not in index_pos and n not in aux_names]
    grad_names = [n for n in float_in if inputs[names.index(n)][1] != 'm']
    lp_in = [n for n in float_in if inputs[names.index(n)][1] not in ('w', 'g')
             and names.index(n) not in base.float32_inputs(op)]
    widened = base.replace(lp_ops=base.lp_ops | {op}, fp32_ops=base.fp32_ops - {op})
    ints = {n: 'int32' for n in names if dtypes[n] == 'int32'}
    if case == 'lp-input':
        data_dtypes = dict(ints, **{n: target for n in lp_in})
        policy = base if cls in _TESTED_CLASSES else widened
    else:
        data_dtypes = ints
        policy = base if cls == LOW_PRECISION else widened
    conv = convert_symbol(sym, policy=policy, data_dtypes=data_dtypes,
                          emulate=(mode == 'emulated'), data_names=names)

    def arrays(low):
        args, aux = {}, {}
        for n in names:
            a = mx.nd.array(values[n], dtype=dtypes[n])
            if low and n in data_dtypes:
                a = mx.nd.amp_cast(a, dtype=dtype_of(target))
            (aux if n in aux_names else args)[n] = a
        return args, aux

    ref_args, ref_aux = arrays(False)
    out_types = sym.infer_type(**{n: dtypes[n] for n in names})[1]
    differentiable = grad_names and all(np.dtype(t).kind == 'f' for t in out_types)
    heads = None
    if differentiable:
        shapes = sym.infer_shape(**{n: values[n].shape for n in names})[1]
        heads = [_round(rng.normal(size=s), target) for s in shapes]
    note = ''
    try:
        mx.random.seed(seed)
        ref_f, ref_g = _run(sym, ref_args, ref_aux, grad_names if heads else [], heads)
    except mx.base.MXNetError as exc:
        if heads is None:
            raise
        # the float32 op itself has no usable gradient here: compare the forward pass only
        note = ('forward only: MXNet registers no gradient for it' if 'non-differentiable'
                in str(exc) else 'forward only: float32 backward fails: %s' % _first_line(exc))
        heads = None
        ref_f, ref_g = _run(sym, ref_args, ref_aux, [], None)
    args, aux = arrays(True)
    mx.random.seed(seed)
    got_f, got_g = _run(conv, args, aux, grad_names if heads else [], heads)
    fe = max(_rel_err(g, r) for g, r in zip(got_f, ref_f))
    be = max((_rel_err(g, r) for g, r in zip(got_g, ref_g)), default=None)
    return fe, be, note


def _first_line(exc):
    lines = [ln.strip() for ln in str(exc).splitlines()
             if ln.strip() and not ln.startswith(('Traceback', '  File', 'Stack trace'))]
    return (lines[-1] if lines else type(exc).__name__)[:200]


if __name__ == '__main__':
    _serve()
