"""Training on several devices and workers: which dtype a gradient travels in, the casts around
its reduction, the root-rank broadcast of initial weights, and a Trainer's kvstore reduction.

MXNet 1.9.1's ``local``/``device`` kvstores reduce float16 and bfloat16; the parameter server of
the dist kvstores aborts on bfloat16 ("Unknown type enum 12") and Horovod's MXNet binding has
none, so bfloat16 travels as float32 there. A kvstore key keeps the dtype it was initialised
with (``kvstore_dist.h``: "The value size cannot be changed"): a gradient exchanged in another
dtype than its weight uses its own key ``i + num_params``. See docs/distributed.md.
"""
import numpy as np
from mxnet import autograd, nd

from .dtypes import dtype_name, is_low_precision, itemsize, mx_dtype, normalize_dtype
from .device import to_default_layout

__all__ = ['EXCHANGE_DTYPES', 'check_grad_dtype', 'check_kvstore_args', 'exchange_dtype',
           'bytes_per_step', 'broadcast_from_root', 'broadcast_params', 'KVStoreExchange',
           'broadcast_initial']

#: Values accepted for ``grad_dtype`` (None: each gradient's own dtype, see exchange_dtype).
EXCHANGE_DTYPES = ('float32', 'float16', 'bfloat16')
_FLOAT_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')


def _no_bfloat16(kv_type):
    """Whether the reduction of ``kv_type`` cannot take bfloat16 (dist kvstores, Horovod)."""
    return 'dist' in (kv_type or '') or kv_type == 'horovod'


def check_grad_dtype(grad_dtype, kv_type, dynamic_scaler):
    """``grad_dtype`` as a canonical name or None; ValueError if it is not one of
    :data:`EXCHANGE_DTYPES`, or not possible with ``kv_type`` or without a dynamic scaler."""
    if grad_dtype is None:
        return None
    try:
        name = normalize_dtype(grad_dtype, allow_float32=True)
    except (TypeError, ValueError):
        name = None
    if name not in EXCHANGE_DTYPES:
        raise ValueError('grad_dtype must be None (each gradient\'s own dtype) or one of %s, '
                         'got %r' % (', '.join(EXCHANGE_DTYPES), grad_dtype))
    if name == 'float16' and not dynamic_scaler:
        raise ValueError("grad_dtype='float16' needs a dynamic loss scaler "
                         "(loss_scaler='dynamic'): float16 overflows above 65504, and only a "
                         'dynamic scaler checks the reduced gradients and backs off')
    if name == 'bfloat16' and _no_bfloat16(kv_type):
        raise ValueError("grad_dtype='bfloat16' is not possible with the %r kvstore: %s. "
                         "Use grad_dtype='float16' (with a dynamic loss scaler) or None"
                         % (kv_type, "Horovod's MXNet binding has no bfloat16 (Horovod "
                            "0.28.1 raises 'GetDType: Type 12 is not supported in MPI mode.', "
                            "with Gloo too)" if kv_type == 'horovod' else "MXNet 1.9.1's parameter server "
                            "aborts on bfloat16 ('Unknown type enum 12')"))
    return name


def exchange_dtype(own_dtype, requested, kv_type):
    """str: the dtype a gradient travels in over ``kv_type`` (``'horovod'`` for Horovod): the
    checked ``requested`` for float gradients, else its own; bfloat16 becomes float32 where
    :func:`_no_bfloat16`."""
    if own_dtype not in _FLOAT_DTYPES:
        return own_dtype
    out = requested or own_dtype
    if out == 'bfloat16' and _no_bfloat16(kv_type):
        out = 'float32'
    return out


def bytes_per_step(params, dtype_of):
    """int: elements x bytes of ``dtype_of(param)`` over ``params`` with a gradient."""
    return int(sum(int(np.prod(p.shape)) * itemsize(dtype_of(p))
                   for p in params if p.grad_req != 'null'))


def check_kvstore_args(kvstore, update_on_kvstore):
    """The kvstore type (str or None) of ``kvstore`` (as for ``gluon.Trainer``); ValueError
    (saying why and what to pass) for ``update_on_kvstore=True`` or an async kvstore."""
    if update_on_kvstore:
        raise ValueError(
            'mxmp.Trainer cannot update on the kvstore (update_on_kvstore=True): it must '
            'see the reduced gradients to check them for inf/NaN and to update the float32 '
            'master weights before the optimizer runs. Pass update_on_kvstore=None or False '
            '(the gradients are still reduced by the kvstore).')
    kv_type = kvstore if isinstance(kvstore, str) else getattr(kvstore, 'type', '')
    if 'async' in (kv_type or ''):
        raise ValueError(
            'mxmp does not support the asynchronous kvstore %r: async training '
            'updates on the kvstore, where overflow cannot be checked. Use a synchronous '
            "kvstore ('device', 'local', 'dist_sync', 'dist_device_sync')." % (kv_type,))
    return kv_type


def broadcast_from_root(entries, send, kv_type=None):
    """Overwrite every weight with the root worker's value, in place, and wait for it;
    returns the keys, in order. ``entries``: ``(key, arrays on every device)``; ``send(key,
    wire)`` replaces ``wire`` (a copy of the first array, in its :func:`exchange_dtype` over
    ``kv_type``) in place with the root's value."""
    done = []
    for key, arrays in entries:
        own = dtype_name(arrays[0].dtype)
        dtype = exchange_dtype(own, None, kv_type)
        with autograd.pause():
            to_default_layout(arrays[0])
            wire = nd.amp_cast(arrays[0], dtype=mx_dtype(dtype)) if dtype != own \
                else arrays[0].copy()
            send(key, wire)
            for arr in arrays:
                nd.amp_cast(wire.as_in_context(arr.context), dtype=arr.dtype, out=arr)
            for arr in arrays:
                arr.wait_to_read()
        done.append(key)
    return done


class KVStoreExchange:
    """A Trainer's gradient reduction over MXNet's kvstore, each gradient in its exchange dtype
    (``grad_dtype``: checked by :func:`check_grad_dtype`), cast into per-key buffers and back.
    The extra key ``i + num_params`` is initialised on first use, on every worker in the same
    order (a dist kvstore's ``init`` is a barrier)."""

    def __init__(self, num_params, grad_dtype):
        self.grad_dtype = grad_dtype
        self._num_params = num_params
        self._buffers = {}   # key -> list of NDArray (one per device)
        self._inited = set()

    def dtype(self, param, kv_type):
        """str: the dtype ``param``'s gradient travels in over ``kv_type`` (None: its own)."""
        own = dtype_name(param.dtype)
        return exchange_dtype(own, self.grad_dtype, kv_type) if kv_type else own

    def cast_in(self, key, grads, dtype):
        """``grads`` if they are of ``dtype``, else this key's buffers holding them cast."""
        if dtype_name(grads[0].dtype) == dtype:
            return grads
        bufs = self._buffers.get(key)
        if bufs is None or bufs[0].shape != grads[0].shape:
            bufs = [nd.zeros(g.shape, ctx=g.context, dtype=mx_dtype(dtype)) for g in grads]
            self._buffers[key] = bufs
        for g, b in zip(grads, bufs):
            nd.amp_cast(g, dtype=b.dtype, out=b)
        return bufs

    @staticmethod
    def cast_out(bufs, grads):
        """Write the reduced ``bufs`` back into ``grads`` (nothing if they are the same)."""
        if bufs is not grads:
            for g, b in zip(grads, bufs):
                nd.amp_cast(b, dtype=g.dtype, out=g)

    def reduce(self, kv, params, distributed):
        """Sum every gradient of ``params`` across devices and workers over ``kv``, in place;
        sparse ones in their own dtype, as gluon.Trainer."""
        for i, param in enumerate(params):
            if param.grad_req == 'null':
                continue
            grads = param.list_grad()
            own, dtype = dtype_name(param.dtype), self.dtype(param, kv.type)
            if grads[0].stype != 'default':
                kv.push(i, grads, priority=-i)
                if param._stype == 'default':
                    kv.pull(i, grads, priority=-i, ignore_sparse=distributed)
            else:   # cast_in/cast_out do nothing for a gradient already in its exchange dtype
                own_key = exchange_dtype(own, None, kv.type) == dtype
                key = i if own_key else i + self._num_params
                with autograd.pause():
                    bufs = self.cast_in(i, grads, dtype)
                    if key not in self._inited and not own_key:
                        kv.init(key, nd.zeros(grads[0].shape, ctx=grads[0].context,
                                              dtype=bufs[0].dtype))
                        self._inited.add(key)
                    kv.pushpull(key, bufs, priority=-i)
                    self.cast_out(bufs, grads)


def broadcast_params(entries, masters, send, kv_type):
    """Give every worker the root worker's values of the Parameters of ``entries``
    (``(key, index in masters, Parameter)``, initialised, dense) through ``send`` (as for
    :func:`broadcast_from_root`), and wait for them. A low-precision Parameter with a gradient
    travels as the root's float32 master (``masters.of(index)``: made from the float32 values
    ``cast_params`` rounded), which becomes every worker's master and, rounded, its value: the
    workers start where one process on the root's values starts."""
    low = {i: masters.of(i) for _, i, p in entries
           if p.grad_req != 'null' and is_low_precision(p.dtype)}
    broadcast_from_root([(key, low.get(i, p.list_data())) for key, i, p in entries], send,
                        kv_type)
    with autograd.pause():
        for _, i, p in entries:
            for arr, value in zip(p.list_data(), low.get(i, ())):
                nd.amp_cast(value, dtype=arr.dtype, out=arr)


def broadcast_initial(kv, params, index_of, masters):
    """Give every worker worker 0's initial weights of ``params`` through the dist kvstore
    ``kv`` (key: ``index_of(param)``) with :func:`broadcast_params` (docs/distributed.md).
    Returns the Parameters broadcast (the initialised dense ones)."""
    ready = [p for p in params if not p._deferred_init and p._stype == 'default']

    def send(idx, wire):
        kv.init(idx, wire)
        kv.pull(idx, out=wire)
    broadcast_params([(index_of(p), index_of(p), p) for p in ready], masters, send, kv.type)
    return ready
