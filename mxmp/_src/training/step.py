"""The one mixed-precision training step, shared by every wrapper mxmp has.

:class:`mxmp.Trainer`, :class:`mxmp.Module`, :mod:`mxmp.amp` (a ``gluon.Trainer``'s
``_amp_loss_scaler`` hook) and :mod:`mxmp._src.horovod` each own one :class:`Step`. It holds what
lives from step to step (the loss scaler, ``skipped_steps``, the float32 master weights, the
stage of the current step and its losses) and does what follows the gradient reduction in
mixed-precision training (Micikevicius et al., "Mixed Precision Training", ICLR 2018; NVIDIA,
"Training With Mixed Precision"), in this order:

1. :meth:`Step.scale_loss`: the loss times the loss scale (kept to tell a NaN in the forward
   pass from an overflow caused by scaling);
2. :meth:`Step.unscale` (optional, e.g. before clipping): the gradients divided by the scale in
   place, once (stage :attr:`Stage.UNSCALED`, as PyTorch's ``GradScaler.unscale_``);
3. :meth:`Step.check`: one overflow check of every gradient on every device
   (:func:`mxmp._src.scaling.overflow.all_finite`; dynamic scalers only; one host sync);
4. :meth:`Step.apply`: skip (overflow) or step: ``rescale_grad = rescale_grad0 / scale``
   (without the scale after :meth:`Step.unscale`), the optimizer calls, the write-back of
   float16/bfloat16 weights from their float32 masters; then :meth:`Step.end`: the scaler
   adjusts (once per iteration of a shared scale, :mod:`mxmp._src.scaling.shared`), a skip counts
   in ``skipped_steps``, and the stage is :attr:`Stage.READY` again.

The ``gluon.Trainer`` hook of :mod:`mxmp.amp` decides only skip-or-step (gluon runs the
optimizer): it calls :meth:`Step.check` and :meth:`Step.end`, the same code.
"""
import enum
import warnings
import weakref

from mxnet import autograd, nd

from ..errors import LossScaleAtFloorError, NonFiniteForwardWarning
from ..scaling.losses import flatten_losses, scale_losses
from ..scaling.overflow import all_finite, nonfinite_names
from ..scaling.shared import group_for
from .master_weights import MasterWeights

__all__ = ['Stage', 'Step', 'StepOwnerMixin', 'apply_update', 'param_grads']


class Stage(enum.Enum):
    """Where a step is between two updates (as ``OptState`` in ``torch/amp/grad_scaler.py``).

    * ``READY``: the gradients (if any) are scaled by the loss scale; the update divides by it;
    * ``UNSCALED``: :meth:`Step.unscale` divided them already; the update leaves the scale out
      of ``rescale_grad``, and a second ``unscale`` is an error.
    """
    READY = 'ready'
    UNSCALED = 'unscaled'


def param_grads(params):
    """The gradient arrays of every device of the Parameters that have one (a generator).

    Args:
        params (iterable of gluon.Parameter): Parameters with ``grad_req == 'null'`` or no
            gradient arrays yet are left out.
    """
    for param in params:
        if param.grad_req != 'null' and param._grad is not None:
            yield from param.list_grad()


class Step:
    """The state of one training loop between updates, and the update itself.

    Args:
        scaler (mxmp.LossScaler): the starting loss scaler.
        owner (object or None): the wrapper this step belongs to (a Trainer), which joins the
            scale group (:mod:`mxmp._src.scaling.shared`) and is named in its errors; held through
            a weak reference. None: the Step itself.
        shared (bool): ``scaler`` is the object the user passed and is shared with every other
            owner given the same object (one loss scale updated once per iteration).

    Attributes:
        masters (MasterWeights): float32 master weights, by the owner's key.
        skipped_steps (int): steps skipped because a gradient was inf/NaN.
        stage (Stage): READY or UNSCALED.
        losses (list of NDArray): this step's losses, from :meth:`scale_loss`.
        group (mxmp._src.scaling.shared.ScaleGroup): the (possibly shared) current scaler.
    """

    def __init__(self, scaler, owner=None, shared=False):
        self._owner = None if owner is None else weakref.ref(owner)
        self.group = group_for(scaler, self if owner is None else owner, shared)
        self.masters = MasterWeights()
        self.skipped_steps = 0
        self.stage = Stage.READY
        self.losses = []

    @property
    def owner(self):
        """The owner given at construction (or this Step)."""
        return self if self._owner is None else self._owner()

    @property
    def scaler(self):
        """mxmp.LossScaler: the current loss scaler (replaced after every step)."""
        return self.group.current

    @scaler.setter
    def scaler(self, value):
        self.group.current = value

    def scale_loss(self, loss):
        """The loss times the loss scale (``loss`` itself when scaling is disabled).

        Args:
            loss (NDArray, or lists/tuples of NDArrays nested to any depth).

        Returns:
            the same nesting of new NDArrays; the flat losses are kept in :attr:`losses`.

        Raises:
            TypeError: an element is not an NDArray (the message says which).
        """
        scaler = self.scaler
        if not scaler.enabled:
            return loss
        scale = float(scaler.scale)
        self.losses = flatten_losses(loss)
        return scale_losses(loss, scale)

    def unscale(self, grads):
        """Divide ``grads`` (NDArrays, e.g. :func:`param_grads`) by the loss scale, in place.

        A no-op when scaling is disabled. Gradients are divided in their own dtype (float16
        values below 2**-24 after division flush to zero); inf/NaN stay and :meth:`check`
        still sees them. Cost: one division per array, no host sync.

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

    def check_can_step(self):
        """Raise RuntimeError if the owner already stepped in this iteration of a shared
        scale (:meth:`mxmp._src.scaling.shared.ScaleGroup.check_can_step`)."""
        self.group.check_can_step(self.owner)

    def check(self, per_device_grads):
        """bool: whether every gradient is finite; True without checking (no host sync) unless
        the scaler is dynamic. ``per_device_grads``: list (per device) of lists of NDArray."""
        return not self.scaler.dynamic or all_finite(per_device_grads)

    def end(self, finite):
        """Close the step: adjust the scaler (once per iteration of its group), count a skip,
        and go back to :attr:`Stage.READY`. ``finite`` (bool): the result of :meth:`check`."""
        self.group.stepped(self.owner, finite)
        if not finite:
            self.skipped_steps += 1
        self.stage = Stage.READY
        self.losses = []

    def apply(self, calls, optimizer, rescale_grad, name_of=None, forward_finite=None):
        """Check for overflow, then run the optimizer on every device, or skip the step.

        Args:
            calls (list of (updater, DeviceUpdate)): one per device (an updater may repeat:
                the Module uses one updater with per-device indices); see
                :func:`mxmp._src.training.master_weights.device_update`.
            optimizer (mx.optimizer.Optimizer): the optimizer the updaters run; its
                ``rescale_grad`` is set here.
            rescale_grad (float): the factor without the loss scale (``1/batch_size`` times
                the user's own factor).
            name_of (callable or None): optimizer index -> parameter name, for the message of
                :class:`LossScaleAtFloorError` (default: the index itself).
            forward_finite (callable or None): ``forward_finite() -> bool``, whether the loss
                (or the outputs) of this step were finite; called only on an overflow (it may
                synchronise with the host). Default: the losses of :meth:`scale_loss`.

        Returns:
            bool: False if the step was skipped because a gradient was inf/NaN (only checked
            with a dynamic scaler).

        Raises:
            LossScaleAtFloorError: the step overflowed and the scaler has now seen
                ``max_overflows_at_floor`` consecutive overflows at its ``min_scale``
                (:attr:`mxmp.DynamicLossScaler.stuck_at_floor`); nothing was updated, and the
                scaler and ``skipped_steps`` are left as they were.

        Warns:
            NonFiniteForwardWarning: the step was skipped and ``forward_finite()`` is False.

        On a step: ``optimizer.rescale_grad = rescale_grad / loss_scale`` (``rescale_grad``
        alone if scaling is disabled or :attr:`Stage.UNSCALED`), then every updater call, then
        the write-backs of low-precision weights from their masters. On a skip nothing of the
        model, the masters or the optimizer (states, update counts, ``rescale_grad``) changes.
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


class StepOwnerMixin:
    """``loss_scaler``, ``loss_scale`` and ``skipped_steps`` of a wrapper whose :class:`Step` is
    ``self._step`` (:class:`mxmp.Trainer`; :class:`mxmp.Module` may use it too)."""

    @property
    def loss_scaler(self):
        """mxmp.LossScaler: the current loss scaler (a new value after every step; shared with
        the other owners given the same scaler object, see :mod:`mxmp._src.scaling.shared`)."""
        return self._step.scaler

    @property
    def loss_scale(self) -> float:
        """float: the current loss scale ``S`` (1.0 when scaling is disabled)."""
        return float(self._step.scaler.scale)

    @property
    def skipped_steps(self) -> int:
        """int: number of steps skipped because a gradient was inf/NaN."""
        return self._step.skipped_steps


def apply_update(calls, optimizer, scaler, rescale_grad, unscaled=False, name_of=None,
                 forward_finite=None):
    """:meth:`Step.apply` for a caller that keeps the scaler itself (the former API).

    Args:
        scaler (mxmp.LossScaler): the current loss scaler.
        unscaled (bool): the gradients were already divided by the loss scale.
        Others as :meth:`Step.apply` (same errors and warnings).

    Returns:
        tuple (applied, scaler): whether the step was applied, and the scaler for the next
        step (``scaler.adjust(applied)``).
    """
    step = Step(scaler)
    if unscaled:
        step.stage = Stage.UNSCALED
    applied = step.apply(calls, optimizer, rescale_grad, name_of, forward_finite)
    return applied, step.scaler
