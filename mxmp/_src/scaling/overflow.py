"""The overflow check: whether gradients hold inf/NaN, over every device, in one host sync.

The only place in mxmp that calls ``mx.nd.multi_all_finite``: the training step
(:mod:`mxmp._src.training.step`) checks every gradient about to be applied here, whether it runs
for :class:`mxmp.Trainer`, :class:`mxmp.Module`, :mod:`mxmp.amp` or :mod:`mxmp._src.horovod`.
"""
from mxnet import nd

from ..dtypes import dtype_name

__all__ = ['MAX_FINITE_ARRAYS', 'all_finite', 'nonfinite_names']

#: ``mx.nd.multi_all_finite`` takes at most 200 arrays per call: its kernel parameter is a
#: fixed array of 200 pointers (MultiAllFiniteKernelParam::N in
#: src/operator/contrib/all_finite-inl.h). All arrays of one call must share one dtype, and
#: bfloat16 is not supported ("Unknown type enum 12").
MAX_FINITE_ARRAYS = 200
_FINITE_DTYPES = ('float16', 'float32', 'float64')


def all_finite(per_device_grads):
    """Whether every gradient is free of inf and NaN: one check over all devices.

    Args:
        per_device_grads (list of list of NDArray): for each device, the gradients that are
            about to be applied on it (after the reduction across devices and workers, so that
            every worker reaches the same answer). Any float dtype; bfloat16 arrays are cast to
            float32 first (``multi_all_finite`` has no bfloat16 kernel); ``row_sparse``
            gradients are checked through their stored values; integer gradients are ignored
            (they cannot hold inf/NaN). Empty lists are allowed.

    Returns:
        bool: False if any element of any gradient is inf or NaN.

    Cost: one ``multi_all_finite`` per 200 arrays per dtype per device, one copy of a
    one-element flag per extra device, and one host synchronisation (the returned bool).
    """
    flags = []
    for grads in per_device_grads:
        if not grads:
            continue
        groups = {}
        for g in grads:
            if g.stype == 'row_sparse':
                g = g.data
            name = dtype_name(g.dtype)
            if name not in _FINITE_DTYPES:
                if name == 'bfloat16':
                    g, name = nd.amp_cast(g, dtype='float32'), 'float32'
                else:
                    continue   # integer gradients cannot overflow to inf/NaN
            groups.setdefault(name, []).append(g)
        flag = nd.ones((1,), ctx=grads[0].context, dtype='float32')
        for arrays in groups.values():
            for start in range(0, len(arrays), MAX_FINITE_ARRAYS):
                chunk = arrays[start:start + MAX_FINITE_ARRAYS]
                nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False,
                                    out=flag)
        flags.append(flag)
    if not flags:
        return True
    if len(flags) > 1:
        ctx = flags[0].context
        flags = [nd.min(nd.concat(*[f.as_in_context(ctx) for f in flags], dim=0))]
    return bool(flags[0].asscalar() > 0)


def nonfinite_names(calls, name_of):
    """Sorted names of the parameters whose gradient holds inf/NaN on some device.

    Args:
        calls (list of (updater, DeviceUpdate)): one per device, as for
            :meth:`mxmp._src.training.step.Step.apply`.
        name_of (callable): optimizer index -> parameter name.

    Cost: one check and one host synchronisation per gradient; only for error messages.
    """
    names = set()
    for _, update in calls:
        for index, grad in zip(update.indices, update.grads):
            if not all_finite([[grad]]):
                names.add(str(name_of(index)))
    return sorted(names)
