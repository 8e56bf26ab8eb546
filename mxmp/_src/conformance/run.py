"""The conformance suite's cases and processes: the one-op graphs (:data:`CASES`), the zygote
that imports MXNet once and forks one child per op (:class:`_Zygote`, :func:`_serve`), and the
child that measures (:func:`_child`). Method, error measure and tolerances: docs/conformance.md.

``CASES[op]``: a list of ``(variant, inputs, attrs)``: ``variant`` names the attribute choice
(``''`` when there is one), ``inputs`` the op's inputs in order as ``(shape, kind)``, ``attrs``
the keyword arguments of ``mx.sym.<op>``. Input kinds (seeded ``numpy.random.RandomState``):
``n`` normal(0, 1); ``p`` uniform(0.5, 2); ``c`` uniform(1.5, 3); ``m`` 0/1 mask; ``w`` normal
weight or bias and ``g`` uniform(0.5, 2) gamma (float32 inputs the pass casts); ``a``
auxiliary state (positive); ``iN`` integers in [0, N) as float32, ``IN`` as int32; ``lN``
sequence lengths in [1, N]; ``sN`` 2 x 128 distinct (row, column) indices into N x N.
:data:`PARAM_KINDS` arrive stored in the target dtype in the ``lp-params`` case.
``NOT_TESTED[op]``: why an op has no case.
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np

from ..errors import mxnet_error_line
from ..policy.policy import FOLLOW, LOW_PRECISION, WIDEST_TYPE, Policy
from ..dtypes import normalize_dtype

PARAM_KINDS = ('w', 'g', 'a')

NCHW = (4, 32, 16, 16)
BTF = (8, 32, 64)
_SMALL = ((8, 1, 64), 'n')


def _one(dims=BTF, kind="n", **attrs):
    return [("", [(dims, kind)], attrs)]


def _two(lhs='n', rhs='n', shapes=(BTF, BTF)):
    return [('', [(shapes[0], lhs), (shapes[1], rhs)], {})]


_X = (NCHW, 'n')
_T = (BTF, 'n')
_BCAST = (NCHW, (1, 32, 1, 1))
_CMP = ('_equal', '_greater', '_greater_equal', '_lesser', '_lesser_equal', '_not_equal')

CASES = {
    # -- gemm --------------------------------------------------------------------------------
    'Convolution': [
        ('dense 3x3', [_X, ((32, 32, 3, 3), 'w'), ((32,), 'w')],
         dict(kernel=(3, 3), pad=(1, 1), num_filter=32)),
        ('depthwise 3x3', [_X, ((32, 1, 3, 3), 'w'), ((32,), 'w')],
         dict(kernel=(3, 3), pad=(1, 1), num_filter=32, num_group=32)),
    ],
    'Deconvolution': [('2x2 stride 2', [_X, ((32, 16, 2, 2), 'w')],
                       dict(kernel=(2, 2), stride=(2, 2), num_filter=16, no_bias=True)),
                      ('4x4 stride 2 bias', [_X, ((32, 16, 4, 4), 'w'), ((16,), 'w')],
                       dict(kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=16,
                            no_bias=False))],
    'FullyConnected': [
        ('flatten=False', [_T, ((128, 64), 'w'), ((128,), 'w')],
         dict(num_hidden=128, flatten=False)),
        ('flatten=True', [_X, ((64, 8192), 'w'), ((64,), 'w')], dict(num_hidden=64)),
    ],
    # -- binary and join (WIDEST_TYPE) ------------------------------------------------------
    'elemwise_add': _two(), 'elemwise_sub': _two(), 'elemwise_mul': _two(),
    'elemwise_div': _two(rhs='p'), '_grad_add': _two(), '_maximum': _two(), '_minimum': _two(),
    '_mod': _two(rhs='p'), '_identity_with_attr_like_rhs': _two(),
    '_scatter_elemwise_div': _two(rhs='p'),
    '_logical_and': _two('m', 'm'), '_logical_or': _two('m', 'm'),
    '_logical_xor': _two('m', 'm'),
    'broadcast_add': _two(shapes=_BCAST), 'broadcast_sub': _two(shapes=_BCAST),
    'broadcast_mul': _two(shapes=_BCAST), 'broadcast_div': _two(rhs='p', shapes=_BCAST),
    'broadcast_mod': _two(rhs='p', shapes=_BCAST),
    'broadcast_maximum': _two(shapes=_BCAST), 'broadcast_minimum': _two(shapes=_BCAST),
    'broadcast_logical_and': _two('m', 'm', _BCAST), 'broadcast_logical_or': _two('m', 'm', _BCAST),
    'broadcast_logical_xor': _two('m', 'm', _BCAST),
    'Concat': [('dim=1', [_X, _X], dict(dim=1, num_args=2))],
    'stack': [('axis=1', [_T, _T], dict(axis=1, num_args=2))],
    'add_n': [('3 inputs', [_X, _X, _X], dict(num_args=3))],
    '_rnn_param_concat': [('dim=0', [((4096,), 'n'), ((1024,), 'n')], dict(dim=0, num_args=2))],
    'where': [('', [(BTF, 'm'), _T, _T], {})],
    'LeakyReLU': [('leaky', [_X], dict(act_type='leaky', slope=0.1)),
                  ('gelu', [_X], dict(act_type='gelu'))],
    '_contrib_index_copy': [('', [((64, 64), 'n'), ((16,), 'I64'), ((16, 64), 'n')], {})],
    '_slice_assign': [('', [_T, ((8, 16, 64), 'n')], dict(begin=(0, 8, 0), end=(8, 24, 64)))],
    # -- FOLLOW: activations, normalization, pooling ----------------------------------------
    'Activation': [(t, [_X], dict(act_type=t)) for t in ('relu', 'sigmoid', 'tanh')],
    # -- FLOAT32 ops with parameters: run by default in the lp-params case only -----------
    'LayerNorm': [('', [_T, ((64,), 'g'), ((64,), 'w')], {})],
    'InstanceNorm': [('', [_X, ((32,), 'g'), ((32,), 'w')], {})],
    'GroupNorm': [('', [_X, ((4,), 'g'), ((4,), 'w')], dict(num_groups=4))],
    'BatchNorm': [('', [_X, ((32,), 'g'), ((32,), 'w'), ((32,), 'a'), ((32,), 'a')],
                   dict(fix_gamma=False))],
    '_contrib_BatchNormWithReLU': [
        ('', [_X, ((32,), 'g'), ((32,), 'w'), ((32,), 'a'), ((32,), 'a')],
         dict(fix_gamma=False))],
    'LRN': [('nsize=5', [_X], dict(nsize=5))],
    'Pooling': [('max 2x2', [_X], dict(pool_type='max', kernel=(2, 2), stride=(2, 2))),
                ('avg 2x2', [_X], dict(pool_type='avg', kernel=(2, 2), stride=(2, 2))),
                ('global avg', [_X], dict(pool_type='avg', kernel=(1, 1), global_pool=True))],
    '_contrib_AdaptiveAvgPooling2D': [('4x4', [_X], dict(output_size=(4, 4)))],
    '_contrib_BilinearResize2D': [('32x32', [_X], dict(height=32, width=32))],
    # -- FOLLOW: shape and copy ------------------------------------------------------------
    'Flatten': _one(NCHW), 'Reshape': _one(NCHW, shape=(4, 32, 256)),
    'SwapAxis': _one(dim1=1, dim2=2), 'expand_dims': _one(axis=1),
    'SliceChannel': [('2 outputs', [_X], dict(num_outputs=2, axis=1))],
    '_split_v2': [('2 outputs', [_X], dict(indices=(0, 16), axis=1))],
    'slice': _one(NCHW, begin=(0, 0, 2, 2), end=(4, 16, 14, 14)),
    'slice_axis': _one(axis=1, begin=4, end=20),
    'slice_like': [('', [_T, ((8, 16, 32), 'n')], {})],
    'reshape_like': [('', [_X, ((4, 32, 256), 'n')], {})],
    'broadcast_like': [('', [_SMALL, _T], {})],
    'broadcast_axis': [('', [_SMALL], dict(axis=1, size=32))],
    'broadcast_to': [('', [_SMALL], dict(shape=BTF))],
    'squeeze': [('', [_SMALL], dict(axis=1))],
    'tile': _one(reps=(1, 2, 1)), 'repeat': _one(repeats=2, axis=1),
    'reverse': _one(axis=1), 'diag': _one((64, 64)),
    'depth_to_space': _one(NCHW, block_size=2), 'space_to_depth': _one(NCHW, block_size=2),
    'transpose': [('NCHW axes (0,2,1,3)', [_X], dict(axes=(0, 2, 1, 3))),
                  ('BTF axes (0,2,1)', [_T], dict(axes=(0, 2, 1)))],
    'cast_storage': _one(NCHW, stype='default'),
    'ones_like': _one(), 'zeros_like': _one(), 'shape_array': _one(), 'size_array': _one(),
    '_contrib_index_array': _one(),
    '_slice_assign_scalar': _one(begin=(0, 8, 0), end=(8, 24, 64), scalar=1.0),
    '_shuffle': _one(),  # the same mx.random.seed gives both runs the same permutation
    '_copy': _one(NCHW), 'BlockGrad': _one(NCHW),
    '_contrib_gradientmultiplier': _one(NCHW, scalar=0.5),
    '_contrib_div_sqrt_dim': _one(),
    # -- FOLLOW: gather ---------------------------------------------------------------------
    'Embedding': [('', [((8, 32), 'i1000'), ((1000, 64), 'n')],
                   dict(input_dim=1000, output_dim=64))],
    '_contrib_SparseEmbedding': [('', [((8, 32), 'i1000'), ((1000, 64), 'n')],
                                  dict(input_dim=1000, output_dim=64))],
    'take': [('', [((1000, 64), 'n'), ((8, 32), 'i1000')], {})],
    'batch_take': [('', [((256, 64), 'n'), ((256,), 'I64')], {})],
    'pick': [('axis=1', [((256, 64), 'n'), ((256,), 'i64')], dict(axis=1))],
    'gather_nd': [('', [((64, 64), 'n'), ((2, 128), 'i64')], {})],
    'scatter_nd': [('', [((128,), 'n'), ((2, 128), 's64')], dict(shape=(64, 64)))],
    'SequenceLast': [('', [((32, 8, 64), 'n'), ((8,), 'l32')], dict(use_sequence_length=True))],
    'SequenceMask': [('', [((32, 8, 64), 'n'), ((8,), 'l32')], dict(use_sequence_length=True))],
    'SequenceReverse': [('', [((32, 8, 64), 'n'), ((8,), 'l32')],
                         dict(use_sequence_length=True))],
    # -- FOLLOW: pointwise math -------------------------------------------------------------
    'clip': _one(a_min=-1.0, a_max=1.0), 'max': _one(axis=2), 'min': _one(axis=2),
    'sqrt': _one(kind='p'), 'arccosh': _one(kind='c'), 'logical_not': _one(kind='m'),
    '_rmod_scalar': _one(kind='p', scalar=2.0), '_mod_scalar': _one(scalar=0.7),
    '_div_scalar': _one(scalar=3.0), '_mul_scalar': _one(scalar=0.5),
    '_plus_scalar': _one(scalar=3.0), '_minus_scalar': _one(scalar=3.0),
    '_rminus_scalar': _one(scalar=3.0), '_maximum_scalar': _one(scalar=0.0),
    '_minimum_scalar': _one(scalar=0.0), '_scatter_plus_scalar': _one(scalar=3.0),
    '_scatter_minus_scalar': _one(scalar=3.0),
    '_contrib_round_ste': _one(NCHW), '_contrib_sign_ste': _one(NCHW),
}
for _op in ('abs', 'arcsinh', 'arctan', 'cbrt', 'ceil', 'cos', 'degrees', 'erf', 'fix', 'floor',
            'negative', 'radians', 'relu', 'rint', 'round', 'sigmoid', 'sign', 'sin', 'softsign',
            'square', 'tanh', 'trunc'):
    CASES[_op] = _one(NCHW)
for _op in _CMP:
    CASES[_op] = _two()
    CASES['broadcast' + _op] = _two(shapes=_BCAST)
    CASES[_op + '_scalar'] = _one(scalar=0.5)
for _op in ('_logical_and_scalar', '_logical_or_scalar', '_logical_xor_scalar'):
    CASES[_op] = _one(kind='m', scalar=1.0)

NOT_TESTED = {
    '_CrossDeviceCopy': 'inserted by the executor between two devices; a one-op graph on one '
                        'CPU cannot contain it',
    '_copyto': "NDArray.copyto's op: it registers no type inference (Symbol.infer_type "
               "returns None), so no typed graph can hold it",
    '_scatter_set_nd': "in-place op of NDArray.__setitem__: its output must be its first "
                       "input's memory (Check failed: inputs[0].dptr_ == outputs[0].dptr_), "
                       "which a bound executor does not arrange",
    '_contrib_boolean_mask': 'output shape depends on the mask values: a bound executor '
                             '(simple_bind) cannot infer it',
}


EPS = {'bfloat16': 2.0 ** -7, 'float16': 2.0 ** -10}
_CASE_NAMES = ('lp-input', 'cast', 'lp-params')
_TESTED_CLASSES = (LOW_PRECISION, FOLLOW, WIDEST_TYPE)


def has_params(op, variant=None):
    """Whether ``op``'s case (one ``variant``, or any) has parameter inputs (``PARAM_KINDS``),
    so that the ``lp-params`` case differs from ``lp-input``."""
    return any(k in PARAM_KINDS for v, inputs, _ in CASES.get(op, ())
               if variant is None or v == variant for _, k in inputs)


def cases_of(op, params_only=False):
    """The ``(variant, case)`` pairs to run for ``op``: ``lp-input`` and ``cast`` for every
    variant (unless ``params_only``), ``lp-params`` for the variants with parameters."""
    return [(v, c) for v, _, _ in CASES[op] for c in _CASE_NAMES
            if (c == 'lp-params' and has_params(op, v)) or
            (c != 'lp-params' and not params_only)]


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
    from .. import graph  # noqa: F401  pylint: disable=unused-import
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
    from ..dtypes import mx_dtype as dtype_of
    return mx.nd.amp_cast(mx.nd.amp_cast(mx.nd.array(values), dtype=dtype_of(target)),
                          dtype='float32').asnumpy()


def _variable_dtypes(sym):
    """{variable name: dtype name} of the variables whose ``__dtype__`` a graph declares
    (the arrays a converted graph is bound with must have these dtypes)."""
    from ..dtypes import from_mshadow_enum
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


def _measure(op, cls, inputs, attrs, case, base, target, mode, seed):
    """``(forward error, backward error or None, note)`` of one case (docs/conformance.md)."""
    import mxnet as mx
    from ..graph.convert import convert_symbol
    from ..dtypes import mx_dtype as dtype_of
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
        policy = base
    else:
        data_dtypes = ints
        policy = base if cls == LOW_PRECISION else widened
    graph = sym
    if params:
        from ..dtypes import MSHADOW_ENUM
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
            if low and (n in data_dtypes or stored.get(n) == target):
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
                in str(exc) else 'forward only: float32 backward fails: %s' % mxnet_error_line(exc, 200))
        heads = None
        ref_f, ref_g = _run(sym, ref_args, ref_aux, [], None)
    args, aux = arrays(True)
    mx.random.seed(seed)
    got_f, got_g = _run(conv, args, aux, grad_names if heads else [], heads)
    fe = max(_rel_err(g, r) for g, r in zip(got_f, ref_f))
    be = max((_rel_err(g, r) for g, r in zip(got_g, ref_g)), default=None)
    return fe, be, note
