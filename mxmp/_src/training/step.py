"""The one mixed-precision training step, owned by :class:`mxmp.Trainer`, :class:`mxmp.Module`,
:mod:`mxmp.amp` and :mod:`mxmp.horovod`: :meth:`Step.scale_loss`, optionally
:meth:`Step.unscale`, :meth:`Step.check` (the overflow check, :func:`all_finite`, the only
caller of ``mx.nd.multi_all_finite``), :meth:`Step.apply` and :meth:`Step.end`
(docs/training.md).
"""
import collections
import enum
import warnings
import weakref

from mxnet import autograd, nd

from ..dtypes import dtype_name
from ..errors import LossScaleAtFloorError, NonFiniteForwardWarning
from ..scaling import LossScaleGroup, flatten_losses, scale_losses

__all__ = ['Stage', 'Step', 'DeviceUpdate', 'device_update', 'param_grads', 'all_finite',
           'MAX_FINITE_ARRAYS']

#: ``mx.nd.multi_all_finite`` takes at most 200 arrays per call (MultiAllFiniteKernelParam::N
#: in MXNet's src/operator/contrib/all_finite-inl.h), of one dtype, and has no bfloat16 kernel.
MAX_FINITE_ARRAYS = 200
_FINITE_DTYPES = ('float16', 'float32', 'float64')


def all_finite(per_device_grads):
    """Whether every gradient is free of inf and NaN: one check over all devices.

    ``per_device_grads`` (list of list of NDArray): per device, the gradients about to be
    applied, any float dtype or sparse (integer ones are ignored). Returns False if any element
    is inf or NaN; one host synchronisation.
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
            if name == 'bfloat16':
                g, name = nd.amp_cast(g, dtype='float32'), 'float32'
            elif name not in _FINITE_DTYPES:
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
    ctx = flags[0].context
    return bool(nd.min(nd.concat(*[f.as_in_context(ctx) for f in flags], dim=0)).asscalar() > 0)


def param_grads(params):
    """The gradient arrays on every device of the Parameters that have one (a generator)."""
    for param in params:
        if param.grad_req != 'null' and param._grad is not None:
            yield from param.list_grad()


DeviceUpdate = collections.namedtuple('DeviceUpdate', ['indices', 'grads', 'weights',
                                                       'writebacks'])
DeviceUpdate.__doc__ = """The optimizer call of one device: ``updater(indices, grads, weights)``,
then ``amp_cast(master, out=weight)`` for every ``(master, weight)`` pair of ``writebacks``."""


def device_update(entries):
    """One device's :class:`DeviceUpdate` from ``(index, weight, grad, master)`` entries: a
    weight with a float32 master (None: updated in place) is updated through it, with its
    gradient cast to float32, and rewritten from it afterwards."""
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


class Stage(enum.Enum):
    """``READY``: the gradients are scaled and the update divides by the scale; ``UNSCALED``:
    :meth:`Step.unscale` divided them already (as ``OptState`` in torch's grad_scaler.py)."""
    READY = 'ready'
    UNSCALED = 'unscaled'


class Step:
    """The state of one training loop between updates, and the update itself.

    Args:
        scaler (mxmp.LossScaler or mxmp._src.scaling.LossScaleGroup): the starting scaler
            (this Step's alone) or a group shared with other owners.
        owner (object or None): the group's member (the Trainer; held weakly); None: the Step.

    Attributes: ``group`` (LossScaleGroup), ``skipped_steps`` (int), ``stage`` (Stage),
    ``losses`` (list of NDArray: this step's, from :meth:`scale_loss`).
    """

    def __init__(self, scaler, owner=None):
        self.group = scaler if isinstance(scaler, LossScaleGroup) else LossScaleGroup(scaler)
        self._owner = None if owner is None else weakref.ref(owner)   # no reference cycle
        self.group.join(self.owner)
        self.skipped_steps = 0
        self.stage = Stage.READY
        self.losses = []

    @property
    def owner(self):
        """The group member this Step stands for: the owner given, or the Step itself."""
        return self if self._owner is None else self._owner()

    @property
    def scaler(self):
        """mxmp.LossScaler: the current loss scaler (replaced after every step)."""
        return self.group.current

    @scaler.setter
    def scaler(self, value):
        self.group.current = value

    def scale_loss(self, loss):
        """The loss (an NDArray or lists/tuples nesting them) times the loss scale, with the
        same nesting; ``loss`` itself when scaling is disabled. Keeps the flat losses in
        :attr:`losses`. TypeError naming an element that is not an NDArray."""
        scaler = self.scaler
        if not scaler.enabled:
            return loss
        self.losses = flatten_losses(loss)
        return scale_losses(loss, float(scaler.scale))

    def unscale(self, grads):
        """Divide ``grads`` (NDArrays) by the loss scale in place, in their own dtype; a no-op
        when scaling is disabled; inf/NaN stay for :meth:`check`.

        Raises:
            RuntimeError: the gradients were unscaled already in this step.
        """
        scaler = self.scaler
        if not scaler.enabled:
            return
        if self.stage is Stage.UNSCALED:
            raise RuntimeError('unscale() was already called since the last step()/update(): '
                               'the gradients are already unscaled. Call unscale() at most '
                               'once per step, between backward() and step().')
        scale = float(scaler.scale)
        with autograd.pause():
            for grad in grads:
                grad /= scale
        self.stage = Stage.UNSCALED

    def check(self, per_device_grads):
        """bool: whether every gradient is finite; True without checking (no host sync) unless
        the scaler is dynamic. ``per_device_grads``: list (per device) of lists of NDArray."""
        return not self.scaler.dynamic or all_finite(per_device_grads)

    def end(self, finite):
        """Close the step: the group adjusts the scaler (once per iteration), a skip counts,
        and the stage is READY again. ``finite`` (bool): the result of :meth:`check`."""
        self.group.stepped(self.owner, finite)
        if not finite:
            self.skipped_steps += 1
        self.stage = Stage.READY
        self.losses = []

    def apply(self, calls, optimizer, rescale_grad, name_of=None, forward_finite=None):
        """Check for overflow, then run the optimizer on every device, or skip the step.

        Args:
            calls (list of (updater, DeviceUpdate)): one per device (an updater may repeat).
            optimizer (mx.optimizer.Optimizer): its ``rescale_grad`` is set to
                ``rescale_grad / loss_scale`` (without the scale if disabled or UNSCALED).
            rescale_grad (float): the factor without the loss scale.
            name_of (callable or None): optimizer index -> parameter name, for errors.
            forward_finite (callable or None): ``() -> bool``, whether the forward pass was
                finite; called only on an overflow. Default: the losses of :meth:`scale_loss`.

        Returns:
            bool: False if the step was skipped because a gradient was inf/NaN.

        Raises:
            LossScaleAtFloorError: the step overflowed with the scale stuck at its floor
                (:attr:`mxmp.DynamicLossScaler.stuck_at_floor`); nothing was updated, the
                scaler and ``skipped_steps`` are unchanged and the stage is READY again.

        Warns:
            NonFiniteForwardWarning: the step was skipped and ``forward_finite()`` is False.
        """
        losses, self.losses = self.losses, []
        if forward_finite is None and losses:
            forward_finite = lambda: all_finite([losses])  # noqa: E731
        scaler = self.scaler
        if not self.check([u.grads for _, u in calls]):
            new = scaler.adjust(False)
            forward_nonfinite = None if forward_finite is None else not forward_finite()
            if forward_nonfinite:
                warnings.warn(NonFiniteForwardWarning(
                    'the forward pass gave inf/NaN (the loss or the outputs are not finite): '
                    'the step is skipped, but this is not an overflow from loss scaling and a '
                    'lower loss scale will not fix it; check the batch (inputs, labels), the '
                    'learning rate, and log/exp/division/sqrt in the model'), stacklevel=3)
            if getattr(new, 'stuck_at_floor', False):
                self.stage = Stage.READY
                names = sorted({str((name_of or str)(i)) for _, u in calls
                                for i, grad in zip(u.indices, u.grads) if not all_finite([[grad]])})
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
            self.end(False)
            return False
        if scaler.enabled and self.stage is not Stage.UNSCALED:
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
        self.end(True)
        return True
