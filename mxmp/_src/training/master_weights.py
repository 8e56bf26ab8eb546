"""float32 master weights of float16/bfloat16 weights, and the per-device optimizer call.

Mixed-precision training updates a float16 or bfloat16 weight through a float32 copy, its
*master weight* (Micikevicius et al., "Mixed Precision Training", ICLR 2018; NVIDIA, "Training
With Mixed Precision"): the gradient is cast to float32, the optimizer updates the master, and
the weight is rewritten from it with ``amp_cast`` (round to nearest even). :class:`MasterWeights`
keeps the copies; :func:`device_update` arranges one device's optimizer call around them; the
step (:mod:`mxmp._src.training.step`) runs it.
"""
import collections
import weakref

import numpy as np
from mxnet import autograd, nd

from ..dtypes import LOW_PRECISION_DTYPES, dtype_name
from ..device import to_default_layout

__all__ = ['MasterWeights', 'DeviceUpdate', 'device_update', 'MasterWeightsMixin']


class MasterWeights:
    """float32 master copies of low-precision weights, one array per device, by key.

    The key is whatever names a weight for its owner (the Trainer's parameter index, the
    Module's parameter name). A master is created on first use by :meth:`get`: from a value
    given to :meth:`set_pending` if there is one (e.g. read from a checkpoint, so no precision
    is lost), else by casting the low-precision arrays to float32. With ``track=True`` (the
    Gluon Trainer) a master is created again when the low-precision arrays it mirrors are
    replaced by other NDArray objects (``param.cast``, ``reset_ctx``); the Module passes
    ``track=False`` because its executors hand out new NDArray handles for the same memory on
    every reshape.

    Extra memory: 4 bytes per element per device for every low-precision weight.
    """

    def __init__(self):
        self._masters = {}   # key -> list of float32 NDArray, one per device
        self._sources = {}   # key -> list of the arrays they mirror (track=True) or None
        self._pending = {}   # key -> float32 numpy array or NDArray, used at creation

    def __contains__(self, key):
        return key in self._masters

    def get(self, key, arrays, track=True):
        """The float32 masters of ``arrays`` (the low-precision weight on each device).

        Args:
            key: hashable name of the weight.
            arrays (list of NDArray): the low-precision weight, one array per device.
            track (bool): re-create the masters if ``arrays`` are not the objects they were
                created from.

        Returns:
            list of NDArray: float32, one per device, the live arrays the optimizer updates.
        """
        masters = self._masters.get(key)
        if masters is not None and len(masters) == len(arrays):
            sources = self._sources.get(key)
            if sources is None or all(a is b for a, b in zip(sources, arrays)):
                return masters
        with autograd.pause():
            pending = self._pending.pop(key, None)
            if pending is not None:
                masters = [_float32_copy(pending, a.context) for a in arrays]
            else:
                # amp_cast fails on a grouped weight that an inference forward left in
                # oneDNN's blocked layout (mxmp/layout.py)
                to_default_layout(arrays)
                masters = [nd.amp_cast(a, dtype='float32') for a in arrays]
        self._masters[key] = masters
        self._sources[key] = list(arrays) if track else None
        return masters

    def set_pending(self, key, value):
        """Create the masters of ``key`` from ``value`` (float32) at the next :meth:`get`.

        Any existing masters of ``key`` are dropped. ``value`` is a numpy array or NDArray
        holding the full-precision weight (a checkpoint's float32 parameter).
        """
        self.discard(key)
        self._pending[key] = value

    def discard(self, key):
        """Forget the masters (and any pending value) of ``key``."""
        self._masters.pop(key, None)
        self._sources.pop(key, None)
        self._pending.pop(key, None)

    def clear(self):
        """Forget every master and pending value."""
        self._masters.clear()
        self._sources.clear()
        self._pending.clear()

    def first_device(self, key):
        """The master of ``key`` on the first device (NDArray), or its pending value, or None."""
        if key in self._masters:
            return self._masters[key][0]
        return self._pending.get(key)

    def to_numpy(self):
        """dict key -> float32 numpy array: the first device's masters plus pending values.

        With reduced gradients every device holds the same master. Host synchronisation.
        """
        out = {k: v[0].asnumpy() for k, v in self._masters.items()}
        for k, v in self._pending.items():
            out[k] = v.asnumpy() if isinstance(v, nd.NDArray) else np.asarray(v, np.float32)
        return out


def _float32_copy(value, ctx):
    if isinstance(value, nd.NDArray):
        return value.as_in_context(ctx).astype('float32', copy=True)
    return nd.array(value, ctx=ctx, dtype='float32')


DeviceUpdate = collections.namedtuple('DeviceUpdate', ['indices', 'grads', 'weights',
                                                       'writebacks'])
DeviceUpdate.__doc__ = """The optimizer call of one device: ``updater(indices, grads, weights)``,
then ``amp_cast(master, out=weight)`` for every ``(master, weight)`` pair of ``writebacks``."""


def device_update(entries):
    """Arrange one device's updates for the optimizer, routing low-precision weights to masters.

    Args:
        entries (iterable of tuple): ``(index, weight, grad, master)`` per weight: the
            optimizer's index for it, the weight and gradient arrays on this device, and its
            float32 master on this device (None for a float32 weight).

    Returns:
        DeviceUpdate: for a weight with a master, the optimizer sees the master and the
        gradient cast to float32 (a temporary array; not copied if already float32), and the
        weight is rewritten from the master afterwards; other weights are updated in place.
    """
    indices, grads, weights, writebacks = [], [], [], []
    for index, weight, grad, master in entries:
        indices.append(index)
        if master is None:
            grads.append(grad)
            weights.append(weight)
        else:
            grads.append(grad if dtype_name(grad.dtype) == 'float32'
                         else nd.amp_cast(grad, dtype='float32'))
            weights.append(master)
            writebacks.append((master, weight))
    return DeviceUpdate(indices, grads, weights, writebacks)


class MasterWeightsMixin:
    """The master-weight API of :class:`mxmp.Trainer` (a mixin): its ``_masters``
    (:class:`MasterWeights` by Parameter index) seen by Parameter."""

    def _is_low_precision(self, param):
        return param.grad_req != 'null' and dtype_name(param.dtype) in LOW_PRECISION_DTYPES

    def _ensure_master(self, i, param):
        """Return the float32 master weights of Parameter ``i`` (one per device)."""
        # Lets a converted block's save_parameters/load_parameters (mxmp._src.block_params) write
        # and set the exact float32 master instead of the stored low-precision rounding.
        param._mxmp_trainer = weakref.ref(self)
        if i not in self._masters and self._masters.first_device(i) is None:
            # cast_params rounded this Parameter when its network was converted: start from
            # the float32 values it held before, not from their rounding
            from ..gluon_graph import unrounded_values
            unrounded = unrounded_values(param)
            if unrounded is not None:
                self._masters.set_pending(i, unrounded[0])
        return self._masters.get(i, param.list_data())

    def _ensure_all_masters(self):
        for i, param in enumerate(self._params):
            if self._is_low_precision(param) and param._data is not None:
                self._ensure_master(i, param)

    def master_weights(self, param):
        """Return the float32 master weights of a float16/bfloat16 Parameter.

        Args:
            param (Parameter or str): a Parameter of this Trainer, or its name.

        Returns:
            list of NDArray: one float32 array per device (in ``param.list_ctx()`` order), the
            live arrays the optimizer updates (created from the Parameter if needed).

        Raises:
            ValueError: the Parameter is not in this Trainer, or has no master weights (its
                dtype is not float16/bfloat16, or its grad_req is 'null').
        """
        i = self._param_index(param)
        p = self._params[i]
        if not self._is_low_precision(p):
            raise ValueError('Parameter %r has no master weights: only float16/bfloat16 '
                             'Parameters with grad_req != "null" have them (dtype %s, '
                             'grad_req %r)' % (p.name, dtype_name(p.dtype), p.grad_req))
        return self._ensure_master(i, p)

    def reset_master_weights(self):
        """Re-create every master weight from the current low-precision Parameter values.

        Call after changing a float16/bfloat16 Parameter in place (``set_data``,
        ``load_parameters``) once training has started. Optimizer states are kept.
        """
        self._masters.clear()
        self._ensure_all_masters()

    def _param_index(self, param):
        if isinstance(param, str):
            if param not in self._param2idx:
                raise ValueError('no Parameter named %r in this Trainer' % param)
            return self._param2idx[param]
        for i, p in enumerate(self._params):
            if p is param:
                return i
        raise ValueError('Parameter %r is not optimized by this Trainer'
                         % getattr(param, 'name', param))
