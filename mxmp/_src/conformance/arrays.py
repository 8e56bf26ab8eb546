"""Arrays of the conformance suite's one-op graphs: input values by kind, the op's Symbol
function, the relative error, and a bound forward/backward run (:mod:`.run`, :mod:`.library`).
"""
import numpy as np

from ..dtypes import dtype_name


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
    if dtype_name(arr.dtype) == 'bfloat16':   # numpy cannot hold it
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
