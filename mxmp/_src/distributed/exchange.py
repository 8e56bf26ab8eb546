"""The gradient exchange over MXNet's kvstore: which dtype travels, under which key, how many bytes.

:class:`mxmp.Trainer` reduces gradients across devices and workers (MXNet's kvstore,
:mod:`mxmp._src.distributed.kvstore`, or Horovod, :mod:`mxmp.horovod`) before its
overflow check (:mod:`mxmp._src.training.step`). This module decides the *exchange dtype* of every
gradient (the dtype it has on the wire and in the kvstore's sum, like DeepSpeed's
``communication_data_type`` or Horovod's ``Compression.fp16``) does the casts around the
reduction (:class:`CastBuffers`) and counts the bytes a worker sends (:func:`bytes_per_step`).

Facts about MXNet 1.9.1's kvstores, measured on the project's machines (CPU build):

* ``local``/``device`` kvstores reduce float16 and bfloat16 arrays;
* the parameter server of ``dist_sync``/``dist_device_sync`` reduces float32 and float16, but
  **aborts on bfloat16**: ``kvstore_dist_server.h:713: Unknown type enum 12`` kills the server
  process (and the job hangs until the workers time out). So bfloat16 never goes to a dist
  kvstore: bfloat16 gradients (``cast_params=True``) travel as float32 there, and
  ``grad_dtype='bfloat16'`` is refused for dist kvstores. The same holds for Horovod (kv_type
  ``'horovod'`` here): its MXNet binding has no bfloat16 ("GetDType: Type 12 is not
  supported", horovod 0.28.1);
* a kvstore key keeps the dtype and byte size it was initialised with (``EncodeDefaultKey`` in
  ``src/kvstore/kvstore_dist.h`` checks "The value size cannot be changed"). Gluon initialises
  key ``i`` with Parameter ``i``'s weight; a gradient exchanged in another dtype therefore uses
  its own key ``i + num_params``, initialised with zeros of the exchange dtype.

A low-precision exchange rounds every worker's gradient to the exchange dtype, and the kvstore
sums in that dtype. float16 overflows above 65504: a scaled gradient that overflows in the
exchange arrives as inf, the overflow check after the reduction sees it on every worker and
the dynamic loss scaler backs off, which is why float16 exchange requires a dynamic scaler.
"""
import numpy as np
from mxnet import autograd, nd

from .. import dtypes as _dtypes
from ..dtypes import dtype_name, mx_dtype, normalize_dtype

__all__ = ['EXCHANGE_DTYPES', 'check_grad_dtype', 'exchange_dtype', 'wire_dtype', 'itemsize',
           'bytes_per_step', 'CastBuffers', 'GradientExchange']

#: Values accepted for ``grad_dtype`` (None: each gradient's own dtype, see exchange_dtype).
EXCHANGE_DTYPES = ('float32', 'float16', 'bfloat16')
_FLOAT_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')


def _no_bfloat16(kv_type):
    """Whether the reduction of ``kv_type`` cannot take bfloat16 (dist kvstores, Horovod)."""
    return 'dist' in (kv_type or '') or kv_type == 'horovod'


def check_grad_dtype(grad_dtype, kv_type, dynamic_scaler):
    """Validate a ``grad_dtype`` option; return it as a canonical name or None.

    Args:
        grad_dtype (None or str or dtype): requested exchange dtype.
        kv_type (str or None): the kvstore type (``'device'``, ``'dist_sync'`` ...), if known.
        dynamic_scaler (bool): whether the loss scaler is dynamic.

    Raises:
        ValueError: not one of :data:`EXCHANGE_DTYPES`; ``'float16'`` without a dynamic loss
            scaler (an overflow in the exchange would go unnoticed); ``'bfloat16'`` with a dist
            kvstore (its parameter server aborts on bfloat16).
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
    """The dtype a gradient of dtype ``own_dtype`` travels in.

    Args:
        own_dtype (str): the gradient's own dtype name (``'bfloat16'`` for contrib.amp's).
        requested (str or None): the checked ``grad_dtype`` option (:func:`check_grad_dtype`).
        kv_type (str or None): the kvstore type (``'horovod'`` for Horovod).

    Returns:
        str: ``requested`` for float gradients when given, else the gradient's own dtype,
        except bfloat16 over a dist kvstore: ``'float32'``. Non-float gradients keep theirs.
    """
    if own_dtype not in _FLOAT_DTYPES:
        return own_dtype
    out = requested or own_dtype
    if out == 'bfloat16' and _no_bfloat16(kv_type):
        out = 'float32'
    return out


def wire_dtype(dtype, kv_type):
    """The dtype a weight of ``dtype`` has in the kvstore (bfloat16 -> float32 on dist)."""
    return 'float32' if dtype == 'bfloat16' and _no_bfloat16(kv_type) else dtype


def itemsize(dtype):
    """int: bytes per element of a dtype name (``'bfloat16'``: 2; other non-float dtypes: 4)."""
    return _dtypes.itemsize(dtype)


def bytes_per_step(params, dtype_of):
    """Gradient bytes one worker sends per step: the sum over Parameters with ``grad_req !=
    'null'`` of elements x bytes per element of ``dtype_of(param)`` (the exchange dtype).
    Parameters whose shape is not known yet (deferred initialisation) count 0.

    Args:
        params (iterable of gluon.Parameter): the Parameters of a Trainer.
        dtype_of (callable): Parameter -> exchange dtype name.
    """
    return int(sum(int(np.prod(p.shape)) * itemsize(dtype_of(p))
                   for p in params if p.grad_req != 'null'))


class CastBuffers:
    """Arrays of an exchange dtype that gradients are cast into for the reduction, and back.

    One buffer list per key (a Parameter's index), allocated on first use and again when the
    gradient's shape changes.
    """

    def __init__(self):
        self._buffers = {}   # key -> list of NDArray (one per device)

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


class GradientExchange:
    """Cast buffers and keys for gradients exchanged in a dtype other than their key's.

    Args:
        num_params (int): number of Parameters of the Trainer (offset of the extra keys).

    The buffers are allocated once per Parameter and device; the extra key of Parameter ``i``
    is ``i + num_params``, initialised on first use (on every worker, in the same order: a dist
    kvstore's ``init`` is a barrier).
    """

    def __init__(self, num_params):
        self._num_params = num_params
        self._casts = CastBuffers()
        self._inited = set()

    def pushpull(self, kvstore, index, grads, dtype, own_key, priority):
        """Reduce ``grads`` (one per device) in ``dtype``; the result is written into ``grads``.

        Args:
            kvstore (KVStore): the Trainer's kvstore.
            index (int): the Parameter's index.
            grads (list of NDArray): the gradient on each device (dense).
            dtype (str): the exchange dtype.
            own_key (bool): whether key ``index`` has ``dtype`` already (no extra key).
            priority (int): kvstore priority.
        """
        key = index if own_key else index + self._num_params
        with autograd.pause():
            bufs = self._casts.cast_in(index, grads, dtype)
            if key not in self._inited and not own_key:
                kvstore.init(key, nd.zeros(grads[0].shape, ctx=grads[0].context,
                                           dtype=bufs[0].dtype))
                self._inited.add(key)
            kvstore.pushpull(key, bufs, priority=priority)
            self._casts.cast_out(bufs, grads)
