"""The numerical contract of mxmp's operator library (docs/conformance.md, "Numerical contract").

Each library op runs, float32, on adversarial inputs and random ones, beside MXNet's own
float32 op on the same inputs; both are measured against a float64 reference computed here with
numpy from the op's definition. The contract, per case and per output:

* the library's error is at most ``4 x`` MXNet's, or one float32 rounding (``2**-23``) where
  MXNet's is smaller (errors: ``max |got - ref| / max |ref|`` over the elements where the
  reference is finite);
* where the reference is NaN, the library gives NaN (MXNet does too: ``x * 0`` is NaN for a
  NaN or inf ``x``), and where it is finite the library is finite.

Cases: ``CASES[op]`` names them; :func:`run_contract` runs them. LayerNorm: random rows, an
outlier feature at every position of a row (and at feature 0 in every row), rows with a large
mean and a small spread, rows of 65,536, 2**18 rows (dgamma/dbeta sums), NaN and inf rows.
softmax with lengths: random, lengths 0, 1, the row and beyond it, all ``-inf`` rows, NaN and
inf, large logits, rows of 65,536. Dropout: NaN, inf and finite values, p = 0.1 and 0.5 (the
definition ``out = x * s``, ``s = 1/(1-p)`` where kept, 0 where dropped; gradient ``dy * s``;
the library's kept elements those its hash keeps for the seeds it returns, :mod:`.dropout`).
GELU (``LeakyReLU``, :mod:`.gelu`): random, large ``|x|``, the negative tail, denormals and
signed zeros, NaN and inf.

bfloat16 (``run_contract(op, dtype='bfloat16')``, the cases of :data:`BF16_CASES`): the library
op takes bfloat16 data (LayerNorm's gamma and beta float32, as the pass gives them) and a
bfloat16 head gradient, and returns bfloat16; the float64 reference is computed from the
bfloat16-rounded inputs; the comparison is MXNet's float32 op on the same rounded inputs with
its bfloat16 outputs rounded to bfloat16 (what a float32 op between casts computes, the graph
of the pass without the library's bfloat16 kernels). The same bar holds.

The conformance suite's ``library`` case runs these (:mod:`.library`), so ``mxmp check-kernels``
checks them on a user's machine; tests/kernels/test_contract.py checks them in the suite.
"""
import numpy as np

from .dropout import dropout_keep
from .gelu import GELU_BF16_CASES, GELU_CASES, gelu_ref

#: The bar: the library's error against float64 is at most this many times MXNet's.
FACTOR = 4.0
#: ... or at most this (one float32 rounding) where MXNet's own error is smaller still.
FLOOR = 2.0 ** -23

_LN_EPS = 1e-5


# ---------------------------------------------------------------------------------------------
# float64 references (the ops' definitions)
def _ln_ref(x, g, b, dy):
    mu = x.mean(-1, keepdims=True)
    rs = 1.0 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + _LN_EPS)
    xh = (x - mu) * rs
    gdy = g * dy
    dx = rs * (gdy - gdy.mean(-1, keepdims=True) - xh * (gdy * xh).mean(-1, keepdims=True))
    rows = (-1, x.shape[-1])
    return [xh * g + b, dx, (dy * xh).reshape(rows).sum(0), dy.reshape(rows).sum(0)]


def _softmax_ref(x, length, dy):
    m = x.shape[-1]
    y = np.zeros_like(x)
    dx = np.zeros_like(x)
    for r in np.ndindex(*x.shape[:-1]):
        n = int(min(max(length[r], 0), m))
        if n == 0:
            continue
        with np.errstate(invalid='ignore', over='ignore'):
            e = np.exp(x[r][:n] - x[r][:n].max())
            y[r][:n] = e / e.sum()
            dx[r][:n] = y[r][:n] * (dy[r][:n] - (dy[r][:n] * y[r][:n]).sum())
    return [y, dx]


# ---------------------------------------------------------------------------------------------
# cases: name -> function(rng) giving the op's float32 inputs (numpy) and head gradients
def _ln_case(shape, kind):
    def make(rng):
        rows, d = int(np.prod(shape[:-1])), shape[-1]
        x = rng.normal(size=(rows, d))
        dy = rng.normal(size=(rows, d))
        if kind == 'outlier every position':
            # row r's outlier sits at feature (r * 97) % d: every position over the rows
            x[np.arange(rows), (np.arange(rows) * 97) % d] += 100.0
        elif kind == 'outlier at feature 0':
            x[:, 0] += 100.0
        elif kind == 'large mean, small spread':
            x = 3000.0 + 0.3 * x
        elif kind == 'many rows':
            dy = 1.0 + 0.1 * dy   # sums of 2**18 values of one sign: float32 drifts
        elif kind == 'nan and inf':
            x[1, 3] = np.nan
            x[2, 5] = np.inf
            x[3, 0] = -np.inf
            dy[4, 2] = np.nan
        return {'x': x.reshape(shape), 'gamma': rng.uniform(0.5, 2.0, d),
                'beta': rng.normal(size=d), 'dy': dy.reshape(shape)}
    return make


def _softmax_case(shape, kind):
    def make(rng):
        m = shape[-1]
        x = rng.normal(size=shape) * 4
        length = np.asarray(rng.randint(0, m + 1, size=shape[:-1]))
        flat = length.reshape(-1)
        if kind == 'lengths 0, 1, row, beyond':
            flat[:] = np.array([0, 1, m, m + 7, 2, m - 1])[np.arange(flat.size) % 6]
        elif kind == 'all -inf rows':
            x.reshape(-1, m)[::3] = -np.inf
            flat[:] = m
        elif kind == 'nan and inf':
            x.reshape(-1, m)[1, 2] = np.nan
            x.reshape(-1, m)[4, 0] = np.inf
            x.reshape(-1, m)[7, 1] = -np.inf
            flat[:] = m
        elif kind == 'large logits':
            x = x * 30
        elif kind == 'long rows':
            flat[:] = [m, m - 12345][:flat.size]
        return {'x': x, 'length': length, 'dy': rng.normal(size=shape)}
    return make


def _dropout_case(shape, p):
    def make(rng):
        x = rng.normal(size=shape)
        flat = x.reshape(-1)
        flat[::97] = np.nan
        flat[1::89] = np.inf
        flat[2::83] = -np.inf
        dy = rng.normal(size=shape)
        dy.reshape(-1)[3::101] = np.nan
        return {'x': x, 'dy': dy, 'p': p}
    return make


CASES = {
    'LayerNorm': [
        ('random', _ln_case((64, 768), 'random')),
        ('outlier at every position', _ln_case((128, 768), 'outlier every position')),
        ('outlier at feature 0, d=4096', _ln_case((16, 4096), 'outlier at feature 0')),
        ('large mean, small spread', _ln_case((64, 768), 'large mean, small spread')),
        ('rows of 65536', _ln_case((3, 65536), 'random')),
        ('2**18 rows (dgamma, dbeta)', _ln_case((2 ** 18, 8), 'many rows')),
        ('NaN and inf', _ln_case((8, 64), 'nan and inf')),
    ],
    'softmax': [
        ('random', _softmax_case((8, 16, 128), 'random')),
        ('lengths 0, 1, row, beyond', _softmax_case((12, 64), 'lengths 0, 1, row, beyond')),
        ('all -inf rows', _softmax_case((9, 32), 'all -inf rows')),
        ('NaN and inf', _softmax_case((9, 32), 'nan and inf')),
        ('large logits', _softmax_case((16, 256), 'large logits')),
        ('rows of 65536', _softmax_case((2, 65536), 'long rows')),
        ('1-D data', _softmax_case((37,), 'random')),
    ],
    'Dropout': [
        ('NaN and inf, p=0.1', _dropout_case((64, 1000), 0.1)),
        ('NaN and inf, p=0.5', _dropout_case((64, 1000), 0.5)),
    ],
    'LeakyReLU': GELU_CASES,   # act_type='gelu' (:mod:`.gelu`)
}
#: Cases also run in bfloat16 (names of :data:`CASES`).
BF16_CASES = {
    'LayerNorm': ('random', 'outlier at every position', 'large mean, small spread',
                  '2**18 rows (dgamma, dbeta)', 'NaN and inf'),
    'softmax': ('random', 'lengths 0, 1, row, beyond', 'all -inf rows', 'NaN and inf',
                'large logits', '1-D data'),
    'Dropout': ('NaN and inf, p=0.1', 'NaN and inf, p=0.5'),
    'LeakyReLU': GELU_BF16_CASES,
}
OUTPUTS = {'LayerNorm': ('out', 'd data', 'd gamma', 'd beta'),
           'softmax': ('out', 'd data'), 'Dropout': ('out', 'd data'),
           'LeakyReLU': ('out', 'd data')}


# ---------------------------------------------------------------------------------------------
# runs
def _err(got, ref):
    """max |got - ref| / max |ref| where ref is finite (inf where got is not finite there)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    if not fin.any():
        return 0.0
    if not np.isfinite(got[fin]).all():
        return float('inf')
    scale = np.abs(ref[fin]).max()
    diff = np.abs(got[fin] - ref[fin]).max()
    return float(diff / scale) if scale > 0 else float(diff)


def _nan_ok(got, ref):
    """Whether ``got`` is NaN exactly where the float64 reference is NaN."""
    return bool((np.isnan(np.asarray(got, np.float64)) == np.isnan(ref)).all())


def _bf16():
    from mxnet.contrib.amp.amp import bfloat16
    return bfloat16


def _nd(a, dtype):
    """An NDArray of numpy ``a`` in ``dtype`` ('float32' or 'bfloat16': rounded by MXNet's cast,
    to nearest even)."""
    import mxnet as mx
    arr = mx.nd.array(a, dtype='float32')
    return arr if dtype == 'float32' else mx.nd.amp_cast(arr, dtype=_bf16())


def _np32(arr):
    """numpy float32 values of an NDArray of any float dtype."""
    import mxnet as mx
    return (arr if arr.dtype == np.float32 else mx.nd.amp_cast(arr, dtype='float32')).asnumpy()


def _rounded(a, dtype):
    """numpy ``a`` as float32, rounded to ``dtype`` first (bfloat16: as MXNet's cast)."""
    return _np32(_nd(a, dtype)) if dtype != 'float32' else np.asarray(a, np.float32)


def _record(fn, arrays, grads, head, dtype='float32', round_out=()):
    """Run ``fn(*arrays)`` forward and backward with head gradient ``head`` in ``dtype``; the
    output and the gradients of ``grads`` as numpy float32, those at positions ``round_out``
    (0: the output, 1...: the gradients) rounded to bfloat16 first."""
    from mxnet import autograd
    for a in grads:
        a.attach_grad()
    with autograd.record():
        out = fn(*arrays)
    out.backward(_nd(head, dtype))
    got = [_np32(out)] + [_np32(a.grad) for a in grads]
    return [_rounded(g, 'bfloat16') if i in round_out else g for i, g in enumerate(got)]


def _run_layer_norm(v, dtype='float32'):
    import mxnet as mx
    x32 = [_rounded(v['x'], dtype)] + [v[k].astype(np.float32) for k in ('gamma', 'beta')]
    dy32 = _rounded(v['dy'], dtype)
    ref = _ln_ref(*[a.astype(np.float64) for a in x32], dy32.astype(np.float64))
    res = {}
    for name, fn in (('lib', lambda x, g, b: mx.nd.mxmp_layer_norm(x, g, b, eps=_LN_EPS)[0]),
                     ('mxnet', lambda x, g, b: mx.nd.LayerNorm(x, g, b, eps=_LN_EPS))):
        lib = name == 'lib'
        arrays = [_nd(x32[0], dtype if lib else 'float32')] + [mx.nd.array(a) for a in x32[1:]]
        res[name] = _record(fn, arrays, arrays, dy32, dtype if lib else 'float32',
                            (0, 1) if dtype != 'float32' and not lib else ())
    return ref, res


def _run_softmax(v, dtype='float32'):
    import mxnet as mx
    x32, dy32 = _rounded(v['x'], dtype), _rounded(v['dy'], dtype)
    length = v['length'].astype(np.int32)
    lshape = length.shape if length.ndim else (1,)
    ref = _softmax_ref(x32.astype(np.float64), length.reshape(x32.shape[:-1]) if
                       x32.ndim > 1 else length.reshape(()), dy32.astype(np.float64))
    res = {}
    for name, fn in (('lib', lambda a, l: mx.nd.mxmp_softmax(a, l, use_length=True)),
                     ('mxnet', lambda a, l: mx.nd.softmax(a, length=l, axis=-1,
                                                          use_length=True))):
        lib = name == 'lib'
        a = _nd(x32, dtype if lib else 'float32')
        lens = mx.nd.array(length.reshape(lshape), dtype='int32')
        res[name] = _record(fn, [a, lens], [a], dy32, dtype if lib else 'float32',
                            (0, 1) if dtype != 'float32' and not lib else ())
    return ref, res


def _run_dropout(v, dtype='float32'):
    """Dropout's masks are random: each op is checked against the definition applied to its
    own mask (the library's recomputed from the seeds it returns, :mod:`.dropout`; for MXNet's,
    kept where out != 0 for finite x), in float64."""
    import mxnet as mx
    x32, dy32, p = _rounded(v['x'], dtype), _rounded(v['dy'], dtype), v['p']
    s = 1.0 / (1.0 - p)
    flag = mx.nd.zeros((1,))
    res, ref = {}, None
    a = _nd(x32, dtype)
    a.attach_grad()
    from mxnet import autograd
    with autograd.record():
        out, seeds = mx.nd.mxmp_dropout(a, flag, p=p, mode='always')
    out.backward(_nd(dy32, dtype))
    keep = dropout_keep(seeds.asnumpy(), x32.shape, p).astype(np.float64)
    with np.errstate(invalid='ignore'):
        ref = [x32.astype(np.float64) * keep * s, dy32.astype(np.float64) * keep * s]
    res['lib'] = [_np32(out), _np32(a.grad)]
    b = mx.nd.array(x32, dtype='float32')
    b.attach_grad()
    with autograd.record():
        y = mx.nd.Dropout(b, p=p, mode='always')
    y.backward(mx.nd.array(dy32, dtype='float32'))
    ym = y.asnumpy()
    finite = np.isfinite(x32)
    kept = np.where(finite, ym != 0, b.grad.asnumpy() != 0)
    with np.errstate(invalid='ignore'):
        mref = [x32.astype(np.float64) * kept * s, dy32.astype(np.float64) * kept * s]
    res['mxnet'] = [_rounded(ym, dtype), _rounded(b.grad.asnumpy(), dtype)]
    res['mxnet_ref'] = mref
    res['dropped'] = float(1.0 - keep.mean())
    return ref, res


def _run_gelu(v, dtype='float32'):
    import mxnet as mx
    x32, dy32 = _rounded(v['x'], dtype), _rounded(v['dy'], dtype)
    ref = gelu_ref(x32, dy32)
    res = {}
    for name, fn in (('lib', mx.nd.mxmp_gelu),
                     ('mxnet', lambda a: mx.nd.LeakyReLU(a, act_type='gelu'))):
        lib = name == 'lib'
        a = _nd(x32, dtype if lib else 'float32')
        res[name] = _record(fn, [a], [a], dy32, dtype if lib else 'float32',
                            (0, 1) if dtype != 'float32' and not lib else ())
    return ref, res


_RUN = {'LayerNorm': _run_layer_norm, 'softmax': _run_softmax, 'Dropout': _run_dropout,
        'LeakyReLU': _run_gelu}


def run_contract(op, seeds=(0,), cases=None, dtype='float32'):
    """Run the contract cases of one library op (its MXNet name: ``'LayerNorm'``,
    ``'softmax'``, ``'Dropout'``, ``'LeakyReLU'`` for GELU) in this process (mxmp's operator library must be loaded).

    Args:
        op (str): the MXNet op the library replaces.
        seeds (tuple of int): input seeds; each case reports its largest errors over them.
        cases (list of str or None): names of ``CASES[op]`` to run (default all; for bfloat16
            those of :data:`BF16_CASES`).
        dtype (str): ``'float32'`` or ``'bfloat16'`` (the library op in bfloat16, module
            docstring); the rows' ``case`` names end with `` [bfloat16]`` then.

    Raises:
        ValueError: another ``dtype``.

    Returns:
        list of dict: per case ``{'op', 'case', 'outputs', 'lib', 'mxnet', 'nan_ok', 'ok',
        'detail'}``: ``lib``/``mxnet`` the errors per output against float64, ``nan_ok``
        whether the library's NaNs are the reference's, ``ok`` the contract (module docstring).
    """
    if dtype not in ('float32', 'bfloat16'):
        raise ValueError("dtype must be 'float32' or 'bfloat16', got %r" % (dtype,))
    if cases is None and dtype == 'bfloat16':
        cases = BF16_CASES[op]
    rows = []
    for name, make in CASES[op]:
        if cases is not None and name not in cases:
            continue
        lib_e = [0.0] * len(OUTPUTS[op])
        mx_e = [0.0] * len(OUTPUTS[op])
        nan_ok = True
        extra = {}
        for seed in seeds:
            ref, res = _RUN[op](make(np.random.RandomState(seed)), dtype)
            mref = res.get('mxnet_ref', ref)
            for i, r in enumerate(ref):
                lib_e[i] = max(lib_e[i], _err(res['lib'][i], r))
                mx_e[i] = max(mx_e[i], _err(res['mxnet'][i], mref[i]))
                nan_ok = nan_ok and _nan_ok(res['lib'][i], r)
            if 'dropped' in res:
                extra['dropped'] = res['dropped']
        worse = [OUTPUTS[op][i] for i in range(len(lib_e))
                 if not lib_e[i] <= max(FACTOR * mx_e[i], FLOOR)]
        detail = []
        if worse:
            detail.append('error above %gx MXNet\'s: %s' % (FACTOR, ', '.join(worse)))
        if not nan_ok:
            detail.append('NaN where the float64 reference is finite, or not where it is NaN')
        if dtype != 'float32':
            name = '%s [%s]' % (name, dtype)
        rows.append(dict({'op': op, 'case': name, 'outputs': list(OUTPUTS[op]), 'lib': lib_e,
                          'mxnet': mx_e, 'nan_ok': nan_ok, 'ok': not worse and nan_ok,
                          'detail': '; '.join(detail)}, **extra))
    return rows
