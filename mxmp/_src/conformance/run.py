"""The conformance suite's processes: the zygote that imports MXNet once and forks one child per
op (:class:`_Zygote`, :func:`_serve`), and the child that measures each case (:func:`_child`).
Method, error measure and tolerances: docs/conformance.md.
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np

from ..errors import mxnet_error_line
from ..policy.policy import FOLLOW, LOW_PRECISION, WIDEST_TYPE, Policy
from ..dtypes import MSHADOW_ENUM, dtype_name, from_mshadow_enum, mx_dtype, normalize_dtype
from .arrays import _op_fn, _rel_err, _run, _values
from .cases import CASES, PARAM_KINDS, RANDOM_OPS

EPS = {'bfloat16': 2.0 ** -7, 'float16': 2.0 ** -10}
_CASE_NAMES = ('lp-input', 'cast', 'lp-params', 'library')
_TESTED_CLASSES = (LOW_PRECISION, FOLLOW, WIDEST_TYPE)


def has_params(op, variant=None):
    """Whether ``op``'s case (one ``variant``, or any) has parameter inputs (``PARAM_KINDS``),
    so that the ``lp-params`` case differs from ``lp-input``."""
    return any(k in PARAM_KINDS for v, inputs, _ in CASES.get(op, ())
               if variant is None or v == variant for _, k in inputs)


def cases_of(op, params_only=False):
    """The ``(variant, case)`` pairs to run for ``op``: ``lp-input`` and ``cast`` for every
    variant (unless ``params_only``), ``lp-params`` for the variants with parameters,
    ``library`` for the ops mxmp's operator library replaces (the pass's kernel rule)."""
    from ..graph.kernel_rule import replaces
    return [(v, c) for v, _, attrs in CASES[op] for c in _CASE_NAMES
            if (c == 'lp-params' and has_params(op, v)) or
            (c == 'library' and replaces(op, attrs)) or
            (c not in ('lp-params', 'library') and not params_only and op not in RANDOM_OPS)]


def tolerances(target_dtype):
    """``(forward, backward)`` relative-error bounds for ``target_dtype``: ``eps`` and
    ``2 * eps``, ``eps`` the dtype's machine epsilon (:data:`EPS`; docs/conformance.md)."""
    eps = EPS[normalize_dtype(target_dtype)]
    return eps, 2 * eps


def _env():
    env = dict(os.environ)
    env.setdefault('OMP_NUM_THREADS', '1')
    env['LIBC_FATAL_STDERR_'] = '1'  # glibc's "corrupted size vs. prev_size" to stderr, not tty
    return env


class _Zygote:
    """A Python process that imports MXNet once and forks one child per op: a kernel that
    corrupts the child's heap kills that child only; the zygote reports its exit status."""

    def __init__(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix='mxmp-check-kernels-')
        self.proc = subprocess.Popen([sys.executable, '-c',
                                      'from mxmp._src.conformance.run import _serve; _serve()'],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=_env(), text=True)

    def __call__(self, job, timeout):
        job = dict(job, timeout=timeout, stdout=os.path.join(self.dir, 'out'),
                   stderr=os.path.join(self.dir, 'err'))
        try:
            self.proc.stdin.write(json.dumps(job) + '\n')
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ''
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
    """Zygote loop (run by :class:`_Zygote`): one job per stdin line, one fork per job."""
    import time
    import traceback
    import mxnet  # noqa: F401  pylint: disable=unused-import
    from ..graph import convert  # noqa: F401  pylint: disable=unused-import
    from .. import cpu_tier
    cpu_tier.quiet()   # the parent prints the tier; each child converts a one-op graph
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


# ---------------------------------------------------------------------------------------------
# Child side: runs in a process forked by the zygote
# ---------------------------------------------------------------------------------------------










def _round(values, target):
    import mxnet as mx
    return mx.nd.amp_cast(mx.nd.amp_cast(mx.nd.array(values), dtype=mx_dtype(target)),
                          dtype='float32').asnumpy()


def _variable_dtypes(sym):
    """{variable name: dtype name} of the variables whose ``__dtype__`` a graph declares
    (the arrays a converted graph is bound with must have these dtypes)."""
    from ..graph.symbol_json import load
    return {n['name']: from_mshadow_enum(n['attrs']['__dtype__']) for n in load(sym)['nodes']
            if n['op'] == 'null' and '__dtype__' in n.get('attrs', {})}


def _child(job):
    from ..device import MISSING_KERNEL_MESSAGE, lp_kernels_available
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
        if case == 'library':
            from .library import library_row
            print(json.dumps(library_row(row, inputs, attrs, job['seeds'])), flush=True)
            continue
        for mode in modes:
            try:
                errs = [_measure(op, cls, inputs, attrs, case, base, target, mode, seed)
                        for seed in job['seeds']]
            except Exception as exc:  # pylint: disable=broad-except
                if mode == 'real' and len(modes) > 1 and MISSING_KERNEL_MESSAGE in str(exc):
                    continue
                row.update(mode=mode, verdict='error', detail='%s: %s'
                           % (type(exc).__name__, mxnet_error_line(exc, 200)))
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


def _measure(op, cls, inputs, attrs, case, base, target, mode, seed, declare=None):
    """``(forward error, backward error or None, note)`` of one case (docs/conformance.md);
    ``lp-params`` runs twice, its parameters declared low precision by their ``__dtype__``
    and by ``data_dtypes`` (``declare``; None: both), and gives the larger errors."""
    if case == 'lp-params' and declare is None:
        first = _measure(op, cls, inputs, attrs, case, base, target, mode, seed, 'data_dtypes')
        second = _measure(op, cls, inputs, attrs, case, base, target, mode, seed, '__dtype__')
        return (max(first[0], second[0]),
                None if first[1] is None else max(first[1], second[1]), first[2] or second[2])
    import mxnet as mx
    from ..graph.convert import convert_symbol
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
    params = []
    if case == 'lp-input':
        data_dtypes = dict(ints, **{n: target for n in lp_in})
        policy = base if cls in _TESTED_CLASSES else widened
    elif case == 'lp-params':
        # As after net.cast(target): the parameters are graph variables stored in the target
        # dtype (__dtype__), the data comes from a low-precision producer, and the op is
        # planned by the policy as it is (a float32 op stays float32).
        params = [n for i, n in enumerate(names)
                  if i not in index_pos and inputs[i][1] in PARAM_KINDS]
        data_dtypes = dict(ints, **{n: target for n in lp_in if n not in params})
        if declare == 'data_dtypes':   # convert_symbol(sym, data_dtypes={weight: target})
            data_dtypes.update({n: target for n in params})
            params = []
        policy = base
    else:
        data_dtypes = ints
        policy = base if cls == LOW_PRECISION else widened
    graph = sym
    if params:
        graph = _op_fn(op)(*[mx.sym.var(n, __dtype__=MSHADOW_ENUM[target]) if n in params
                             else mx.sym.var(n) for n in names], name='op', **attrs)
    conv = convert_symbol(graph, policy=policy, data_dtypes=data_dtypes,
                          emulate=(mode == 'emulated'),
                          data_names=[n for n in names if n not in params])
    stored = _variable_dtypes(conv)

    def arrays(low):
        args, aux = {}, {}
        for n in names:
            a = mx.nd.array(values[n], dtype=dtypes[n])
            if low and stored.get(n, data_dtypes.get(n)) == target:   # as the graph declares
                a = mx.nd.amp_cast(a, dtype=mx_dtype(target))
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
                in str(exc) else 'forward only: float32 backward fails: %s' % mxnet_error_line(exc, 200))
        heads = None
        ref_f, ref_g = _run(sym, ref_args, ref_aux, [], None)
    args, aux = arrays(True)
    mx.random.seed(seed)
    got_f, got_g = _run(conv, args, aux, grad_names if heads else [], heads)
    fe = max(_rel_err(g, r) for g, r in zip(got_f, ref_f))
    be = max((_rel_err(g, r) for g, r in zip(got_g, ref_g)), default=None)
    return fe, be, note

