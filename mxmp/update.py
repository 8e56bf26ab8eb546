"""One mixed-precision optimizer update, shared by :class:`mxmp.Trainer` and :class:`mxmp.Module`.

The three steps that follow the gradient reduction in mixed-precision training (Micikevicius et
al., "Mixed Precision Training", ICLR 2018; NVIDIA, "Training With Mixed Precision" guide):

1. **overflow check** (:func:`all_finite`): every gradient about to be applied, on every device,
   is checked for inf/NaN with ``mx.nd.multi_all_finite``; one host synchronisation per step;
2. **float32 master weights** (:class:`MasterWeights`, :func:`device_update`): a float16 or
   bfloat16 weight is updated through a float32 copy (its *master weight*), with the gradient
   cast to float32, and is then rewritten from it with ``amp_cast`` (round to nearest even);
3. **the step** (:func:`apply_update`): skipped entirely on overflow (no weight, master weight,
   optimizer state or update count changes) while the loss scale backs off; otherwise the
   optimizer runs with ``rescale_grad = rescale_grad0 / loss_scale``.

Both wrappers hand this module per-device lists of ``(optimizer index, weight, gradient,
master or None)``; the Gluon Trainer has one updater per device, the Module one updater for all
devices with per-device indices (``index * num_devices + device``, as MXNet 1.9.1's
``model._update_params``). :func:`write_atomic` and :func:`save_atomic` are the crash-safe file writers both use for
their checkpoint files.
"""
import collections
import os
import tempfile
import warnings

import numpy as np
from mxnet import autograd, nd

from .dtypes import LOW_PRECISION_DTYPES, dtype_name, is_low_precision  # noqa: F401
from .errors import LossScaleAtFloorError, NonFiniteForwardWarning
from .layout import to_default_layout

__all__ = ['LOW_PRECISION_DTYPES', 'dtype_name', 'is_low_precision', 'all_finite',
           'MasterWeights', 'DeviceUpdate', 'device_update', 'apply_update', 'write_atomic',
           'save_atomic', 'LossScaleAtFloorError', 'NonFiniteForwardWarning',
           'nonfinite_names']

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


def nonfinite_names(calls, name_of):
    """Sorted names of the parameters whose gradient holds inf/NaN on some device.

    Args:
        calls (list of (updater, DeviceUpdate)): as for :func:`apply_update`.
        name_of (callable): optimizer index -> parameter name.

    Cost: one check and one host synchronisation per gradient; only for error messages.
    """
    names = set()
    for _, update in calls:
        for index, grad in zip(update.indices, update.grads):
            if not all_finite([[grad]]):
                names.add(str(name_of(index)))
    return sorted(names)


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


def apply_update(calls, optimizer, scaler, rescale_grad, unscaled=False, name_of=None,
                 forward_finite=None):
    """Check for overflow, then run the optimizer on every device, or skip the step.

    Args:
        calls (list of (updater, DeviceUpdate)): one per device (an updater may repeat: the
            Module uses one updater with per-device indices).
        optimizer (mx.optimizer.Optimizer): the optimizer the updaters run; its
            ``rescale_grad`` is set here.
        scaler (mxmp.scaler.LossScaler): the current loss scaler.
        rescale_grad (float): the factor without the loss scale (``1/batch_size`` times the
            user's own factor).
        unscaled (bool): the gradients were already divided by the loss scale
            (``Trainer.unscale``).
        name_of (callable or None): optimizer index -> parameter name, for the message of
            :class:`LossScaleAtFloorError` (default: the index itself).
        forward_finite (callable or None): ``forward_finite() -> bool``, whether the loss (or
            the outputs) of this step were finite; called only on an overflow (it may
            synchronise with the host), to tell a NaN in the forward pass from an overflow
            caused by loss scaling.

    Returns:
        tuple (applied, scaler): ``applied`` is False if the step was skipped because a
        gradient was inf/NaN (only checked with a dynamic scaler); ``scaler`` is the scaler
        for the next step (``scaler.adjust(applied)``).

    Raises:
        LossScaleAtFloorError: the step overflowed and the scaler has now seen
            ``max_overflows_at_floor`` consecutive overflows at its ``min_scale``
            (:attr:`mxmp.scaler.DynamicLossScaler.stuck_at_floor`); nothing was updated.

    Warns:
        NonFiniteForwardWarning: the step was skipped and ``forward_finite()`` is False.

    On a step: ``optimizer.rescale_grad = rescale_grad / loss_scale`` (``rescale_grad`` alone
    if scaling is disabled or ``unscaled``), then every updater call, then the write-backs of
    low-precision weights from their masters. On a skip nothing of the model, the masters or
    the optimizer (states, update counts, ``rescale_grad``) changes.
    """
    if scaler.dynamic and not all_finite([u.grads for _, u in calls]):
        new = scaler.adjust(False)
        forward_nonfinite = None if forward_finite is None else not forward_finite()
        if forward_nonfinite:
            warnings.warn(NonFiniteForwardWarning(
                'the forward pass gave inf/NaN (the loss or the outputs are not finite): the '
                'step is skipped, but this is not an overflow from loss scaling and a lower '
                'loss scale will not fix it; check the batch (inputs, labels), the learning '
                'rate, and log/exp/division/sqrt in the model'), stacklevel=3)
        if getattr(new, 'stuck_at_floor', False):
            names = nonfinite_names(calls, name_of or (lambda i: i))
            raise LossScaleAtFloorError(
                'the loss scale has been at its floor (min_scale=%g) for %d consecutive '
                'overflowing steps: the inf/NaN gradients are not caused by loss scaling. '
                '%sParameters with inf/NaN gradients on the last step: %s. Fix the cause '
                '(inputs, learning rate, unstable ops), lower min_scale, or raise '
                'max_overflows_at_floor of the DynamicLossScaler (0 never raises).'
                % (new.min_scale, new.overflows_at_floor,
                   'The forward pass itself was not finite (the loss is inf/NaN). '
                   if forward_nonfinite else '', ', '.join(names) or '(none found)'),
                names, forward_nonfinite)
        return False, new
    if scaler.enabled and not unscaled:
        optimizer.rescale_grad = rescale_grad / float(scaler.scale)
    else:
        optimizer.rescale_grad = rescale_grad
    with autograd.pause():
        for updater, update in calls:
            if update.indices:
                updater(update.indices, update.grads, update.weights)
        for _, update in calls:
            for master, weight in update.writebacks:
                nd.amp_cast(master, dtype=weight.dtype, out=weight)
    return True, scaler.adjust(True)


def write_atomic(fname, data):
    """Write ``data`` (bytes or str) to ``fname`` atomically.

    A temporary file in the same directory is written, flushed and fsynced, then
    ``os.replace``d over ``fname`` (atomic on POSIX and Windows); a crash leaves either the old
    file or the new one, never a mix. The directory is fsynced afterwards where the platform
    allows it, so the rename survives a power loss. A process killed while writing may leave
    its temporary file (``.<name>.<random>.tmp``) beside ``fname``; ``fname`` itself is intact.

    Args:
        fname (str or os.PathLike): destination path.
        data (bytes or str): the content; str is written as UTF-8.

    Raises:
        OSError: the directory is not writable; the temporary file is removed.
    """
    if isinstance(data, str):
        data = data.encode('utf-8')

    def write(tmp):
        with open(tmp, 'wb') as fout:
            fout.write(data)
    save_atomic(fname, write)


def save_atomic(fname, save):
    """Let ``save(path)`` write a file, then move it over ``fname`` atomically and durably.

    For writers that want a path rather than bytes (``nd.save``, ``Block.save_parameters``,
    ``gluon.Trainer.save_states``): ``save`` writes a temporary file in ``fname``'s directory,
    which is then fsynced, ``os.replace``d over ``fname`` and followed by an fsync of the
    directory (where the platform allows it). A crash at any point leaves either the old
    ``fname`` or the new one, complete (POSIX rename semantics; "Files are hard",
    https://danluu.com/file-consistency/ explains why the two fsyncs are needed).

    Args:
        fname (str or os.PathLike): destination path.
        save (callable): ``save(tmp_path)`` writes the whole file to ``tmp_path``.

    Raises:
        whatever ``save`` raises, or OSError; the temporary file is removed and ``fname`` is
        untouched.
    """
    fname = os.fspath(fname)
    directory = os.path.dirname(os.path.abspath(fname))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix='.%s.' % os.path.basename(fname),
                               suffix='.tmp')
    os.close(fd)
    try:
        save(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, fname)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:   # make the rename durable; not possible on every platform/filesystem
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
