"""float32 master weights of float16/bfloat16 weights (Micikevicius et al., "Mixed Precision
Training", ICLR 2018): the optimizer updates the float32 copy and the weight is rewritten from
it with ``amp_cast``. :class:`MasterWeights` keeps the copies by key; :class:`ParameterMasters`
are a Trainer's, by Parameter index; :func:`master_value` and :func:`set_master_value` let the
parameter files of a converted network (:mod:`mxmp._src.block_params`) read and set them.
"""
import ctypes
import weakref

from mxnet import autograd, nd
from mxnet.base import _LIB, check_call

from ..dtypes import LOW_PRECISION_DTYPES, dtype_name
from ..device import to_default_layout
from ..gluon_graph import unrounded_values, value_generation

__all__ = ['MasterWeights', 'ParameterMasters', 'is_low_precision', 'master_value',
           'set_master_value']


class MasterWeights:
    """float32 master copies of low-precision weights, one array per device, by key.

    A master is created by :meth:`get`: from a value given to :meth:`set_pending` (e.g. a
    checkpoint's float32 value), else by casting the low-precision arrays to float32. With
    ``track=True`` it is created again when the arrays it mirrors are replaced by other NDArray
    objects (``param.cast``, ``reset_ctx``); the Module passes ``track=False`` (its executors
    hand out new handles for the same memory on every reshape).
    """

    def __init__(self):
        self._masters = {}   # key -> list of float32 NDArray, one per device
        self._sources = {}   # key -> list of the arrays they mirror (track=True) or None
        self._pending = {}   # key -> float32 NDArray, used at creation

    def get(self, key, arrays, track=True):
        """The float32 masters (one per device, the live arrays the optimizer updates) of
        ``arrays``, the low-precision weight ``key`` on each device; with ``track``, made
        again if ``arrays`` are not the objects they were made from."""
        masters = self._masters.get(key)
        if masters is not None and len(masters) == len(arrays):
            sources = self._sources.get(key)
            if sources is None or all(_same_array(a, b) for a, b in zip(sources, arrays)):
                if sources is not None:
                    self._sources[key] = list(arrays)   # compared by identity from now on
                return masters
        with autograd.pause():
            pending = self._pending.pop(key, None)
            if pending is not None:
                masters = [pending.as_in_context(a.context).astype('float32', copy=True)
                           for a in arrays]
            else:
                # amp_cast fails on a weight left in oneDNN's blocked layout
                to_default_layout(arrays)
                masters = [nd.amp_cast(a, dtype='float32') for a in arrays]
        self._masters[key] = masters
        self._sources[key] = list(arrays) if track else None
        return masters

    def set_pending(self, key, value):
        """Make the masters of ``key`` from ``value`` (float32 numpy array or NDArray) at the
        next :meth:`get`, dropping any existing ones."""
        self.discard(key)
        self._pending[key] = value if isinstance(value, nd.NDArray) else \
            nd.array(value, dtype='float32')

    def discard(self, key):
        """Forget the masters (and any pending value) of ``key``."""
        for table in (self._masters, self._sources, self._pending):
            table.pop(key, None)

    def clear(self):
        """Forget every master and pending value."""
        for table in (self._masters, self._sources, self._pending):
            table.clear()

    def first_device(self, key):
        """The master of ``key`` on the first device (NDArray), or its pending value, or None."""
        if key in self._masters:
            return self._masters[key][0]
        return self._pending.get(key)

    def to_numpy(self):
        """dict key -> float32 numpy array: the first device's masters and pending values."""
        keys = list(self._masters) + list(self._pending)
        return {k: self.first_device(k).asnumpy() for k in keys}


def _data_pointer(array):
    pointer = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    return pointer.value


def _same_array(a, b):
    """Whether NDArray ``b`` is ``a`` or a view of the same memory as ``a`` with its shape,
    dtype and device: Gluon replaces a Parameter's arrays by ``detach()`` copies of them
    (the same memory) when its grad_req becomes 'null'; that does not change its value."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and a.context == b.context
                      and a.stype == b.stype == 'default'
                      and _data_pointer(a) == _data_pointer(b))


def is_low_precision(param):
    """bool: whether a Parameter gets master weights (float16/bfloat16, grad_req != 'null')."""
    return param.grad_req != 'null' and dtype_name(param.dtype) in LOW_PRECISION_DTYPES


# Parameter -> (weakref to the ParameterMasters that last made its masters, its index there).
# The Parameter is held weakly (the key) and the masters weakly (they hold the Parameter).
_OWNERS = weakref.WeakKeyDictionary()


class ParameterMasters(MasterWeights):
    """The master weights of a Trainer's Parameters, by index in ``params``."""

    def __init__(self, params):
        super().__init__()
        self.params = params
        self._made = {}   # index -> the value generation (value_changed) its masters are of

    def of(self, i):
        """The float32 masters (one per device) of low-precision Parameter ``i``: the masters
        of another live Trainer of the same Parameter if it made them last (two Trainers over
        one Parameter update one float32 value, as two gluon.Trainers update one weight);
        else made from a value given to :meth:`set_pending`, else from its unrounded float32
        values if ``cast_params`` kept them, else from its values. Made again after its value
        was set from outside (``Parameter.set_data``: mxmp's hook, which every mxmp.Trainer
        installs, calls :func:`mxmp._src.gluon_graph.value_changed`)."""
        param = self.params[i]
        generation = value_generation(param)
        if self._made.get(i, generation) != generation:
            self.discard(i)   # set_data since they (or the pending value) were made
        if i not in self._pending:
            owner, j = _owner(param)
            if owner is not None and owner is not self:
                theirs = owner.of(j)
                if all(_same_array(a, b) for a, b in zip(owner._sources.get(j) or (),
                                                         param.list_data())):
                    self._masters[i], self._sources[i] = theirs, owner._sources[j]
        if self.first_device(i) is None:
            unrounded = unrounded_values(param)
            if unrounded is not None:
                self.set_pending(i, unrounded[0])
        masters = self.get(i, param.list_data())
        self._made[i] = generation
        _OWNERS[param] = (weakref.ref(self), i)
        return masters

    def set_pending(self, key, value):
        """:meth:`MasterWeights.set_pending`, dropped if the Parameter's value is set from
        outside (``set_data``) before its masters are made from it."""
        super().set_pending(key, value)
        self._made[key] = value_generation(self.params[key])

    def ensure_all(self):
        """Create (or bring up to date) the masters of every initialised low-precision
        Parameter, and of a frozen one (grad_req='null') that has masters from before it was
        frozen: they are kept for its unfreezing, and saved (a weight rebuilt from its rounded
        value would lose what the master holds below the rounding)."""
        for i, param in enumerate(self.params):
            if param._data is not None and (is_low_precision(param) or (
                    i in self._masters and dtype_name(param.dtype) in LOW_PRECISION_DTYPES)):
                self.of(i)


def _owner(param):
    """``(the live ParameterMasters that last made masters of param or None, its index)``."""
    masters, i = _OWNERS.get(param, (lambda: None, None))
    return masters(), i


def master_value(param):
    """The float32 master weight (first device) a live Trainer keeps for ``param``, or None."""
    masters, i = _owner(param)
    return None if masters is None else masters.first_device(i)


def set_master_value(param, value):
    """Make ``value`` (NDArray) ``param``'s float32 master weight in the Trainer that keeps
    one, from the next update on."""
    masters, i = _owner(param)
    if masters is not None:
        masters.set_pending(i, value if dtype_name(value.dtype) == 'float32'
                            else nd.amp_cast(value, dtype='float32'))
