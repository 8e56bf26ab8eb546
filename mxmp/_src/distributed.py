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
           'bytes_per_step', 'broadcast_from_root', 'KVStoreExchange', 'broadcast_initial']

#: Values accepted for ``grad_dtype`` (None: each gradient's own dtype, see exchange_dtype).
EXCHANGE_DTYPES = ('float32', 'float16', 'bfloat16')
_FLOAT_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')


def _no_bfloat16(kv_type):
    """Whether the reduction of ``kv_type`` cannot take bfloat16 (dist kvstores, Horovod)."""
    return 'dist' in (kv_type or '') or kv_type == 'horovod'


def check_grad_dtype(grad_dtype, kv_type, dynamic_scaler):
    """``grad_dtype`` (None, str or dtype) as a canonical name or None, for a kvstore of type
    ``kv_type`` and a loss scaler that is dynamic or not (``dynamic_scaler``).

    Raises:
        ValueError: not one of :data:`EXCHANGE_DTYPES`; ``'float16'`` without a dynamic loss
            scaler; ``'bfloat16'`` with a dist kvstore or Horovod.
    """
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
                         % (kv_type, "Horovod's MXNet binding has no bfloat16"
                            if kv_type == 'horovod' else "MXNet 1.9.1's parameter server "
                            "aborts on bfloat16 ('Unknown type enum 12')"))
    return name


def exchange_dtype(own_dtype, requested, kv_type):
    """str: the dtype a gradient of dtype ``own_dtype`` travels in over ``kv_type`` (str or
    None; ``'horovod'`` for Horovod): the checked ``grad_dtype`` ``requested`` for float
    gradients, else their own; bfloat16 becomes float32 over dist kvstores and Horovod."""
    if own_dtype not in _FLOAT_DTYPES:
        return own_dtype
    out = requested or own_dtype
    if out == 'bfloat16' and _no_bfloat16(kv_type):
        out = 'float32'
    return out


def bytes_per_step(params, dtype_of):
    """int: gradient bytes one worker sends per step: over ``params`` with a gradient,
    elements x bytes of ``dtype_of(param)`` (the exchange dtype); deferred shapes count 0."""
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
    """Overwrite every weight with the root worker's value, in place, and wait for it.

    Args:
        entries (iterable of (key, list of NDArray)): a weight's backend key and its arrays,
            one per device (the first is sent, as a fresh copy in the default layout).
        send (callable): ``send(key, wire)`` replaces NDArray ``wire`` in place with the
            root's value of ``key`` (``kv.init`` and ``kv.pull``, or ``hvd.broadcast_``).
        kv_type (str or None): the backend (a kvstore type or ``'horovod'``); a weight travels
            in :func:`exchange_dtype` ``(own, None, kv_type)``.

    Returns:
        list: the keys broadcast, in order. One host synchronisation per weight.
    """
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
    """A Trainer's gradient reduction over MXNet's kvstore, each gradient in its exchange dtype.

    Args:
        num_params (int): number of the Trainer's Parameters (offset of the extra keys).
        grad_dtype (str or None): the checked ``grad_dtype`` (:func:`check_grad_dtype`).

    The extra key of Parameter ``i`` is initialised on first use, on every worker in the same
    order (a dist kvstore's ``init`` is a barrier). Gradients are cast into buffers of their
    exchange dtype for the reduction, and back; per key, made again when the shape changes.
    """

    def __init__(self, num_params, grad_dtype):
        self.grad_dtype = grad_dtype
        self._num_params = num_params
        self._buffers = {}   # key -> list of NDArray (one per device)
        self._inited = set()

    def dtype(self, param, kv_type):
        """str: the dtype ``param``'s gradient travels in over a reduction of ``kv_type`` (str,
        ``'horovod'`` for Horovod; None: none, its own dtype)."""
        own = dtype_name(param.dtype)
        return exchange_dtype(own, self.grad_dtype, kv_type) if kv_type else own

    def cast_in(self, key, grads, dtype):
        """``grads`` cast to ``dtype`` (dtype name): ``grads`` itself if they have it already,
        else this key's buffers, holding the cast values."""
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
        """Sum every gradient of ``params`` (list of Parameter) across devices and workers
        over ``kv``, in place; sparse gradients in their own dtype, as gluon.Trainer."""
        for i, param in enumerate(params):
            if param.grad_req == 'null':
                continue
            grads = param.list_grad()
            own, dtype = dtype_name(param.dtype), self.dtype(param, kv.type)
            if grads[0].stype != 'default':
                kv.push(i, grads, priority=-i)
                if param._stype == 'default':
                    kv.pull(i, grads, priority=-i, ignore_sparse=distributed)
            elif dtype == own:
                kv.pushpull(i, grads, priority=-i)
            else:
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


def broadcast_initial(kv, params, index_of, masters):
    """Give every worker worker 0's initial weights through a dist kvstore, and wait for them
    (docs/distributed.md: a late pull would write the summed gradient into the weight). A
    low-precision Parameter travels as the root's float32 master, every worker's master.

    Args:
        kv (KVStore): the dist kvstore.
        params (list of Parameter): the Parameters to initialise.
        index_of (callable): Parameter -> its key (index in the Trainer).
        masters (mxmp._src.training.master_weights.ParameterMasters): the Trainer's masters.

    Returns:
        list of Parameter: those broadcast (initialised dense ones).
    """
    ready = [p for p in params if not p._deferred_init and p._stype == 'default']
    low = {p: masters.of(index_of(p)) for p in ready
           if p.grad_req != 'null' and is_low_precision(p.dtype)}

    def send(idx, wire):
        kv.init(idx, wire)
        kv.pull(idx, out=wire)
    broadcast_from_root([(index_of(p), low.get(p, p.list_data())) for p in ready], send,
                        kv.type)
    with autograd.pause():
        for p, source in low.items():
            for arr, value in zip(p.list_data(), source):
                nd.amp_cast(value, dtype=arr.dtype, out=arr)
    return ready
