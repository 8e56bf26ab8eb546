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

import mxnet as mx
from mxnet import autograd, nd

from ..dtypes import dtype_name
from ..errors import LossScaleAtFloorError, NonFiniteForwardWarning
from ..scaling import (LossScaleGroup, cast_keeping_storage, divide, flatten_losses,
                       scale_losses)

__all__ = ['Stage', 'Step', 'DeviceUpdate', 'device_update', 'update_groups', 'param_grads',
           'all_finite', 'finite_flag', 'flags_finite', 'warn_forward_nonfinite',
           'MAX_FINITE_ARRAYS', 'UPDATE_GROUP', 'KEEPS_GRADIENTS']

#: ``mx.nd.multi_all_finite`` takes at most 200 arrays per call (MultiAllFiniteKernelParam::N
#: in MXNet's src/operator/contrib/all_finite-inl.h), of one dtype, and has no bfloat16 kernel.
MAX_FINITE_ARRAYS = 200
#: Weights per optimizer call when their low-precision gradients are cast to float32 for the
#: master-weight update (:func:`update_groups`), and per float32 check of bfloat16 gradients.
UPDATE_GROUP = 8
_FINITE_DTYPES = ('float16', 'float32', 'float64')
#: Optimizers that keep a reference to a gradient they were given after the call returns
#: (MXNet 1.9.1's LBSGD accumulates ``cum_grad = grad`` over ``batch_scale`` calls): the
#: float32 copies of their low-precision gradients are made in one call, never in a buffer
#: that the next group overwrites (tests/training/test_update_memory.py runs every optimizer
#: of ``mx.optimizer.Optimizer.opt_registry`` grouped against one call).
KEEPS_GRADIENTS = (mx.optimizer.LBSGD,)


def all_finite(per_device_grads):
    """Whether no gradient (per device, a list of NDArray of any dtype or storage; integer
    ones are ignored) holds inf or NaN: one host synchronisation (:func:`finite_flag`)."""
    flags = [finite_flag(grads) for grads in per_device_grads if grads]
    return flags_finite(flags)


def flags_finite(flags):
    """Whether every flag (float32 NDArray of shape (1,), from :func:`finite_flag`, on any
    devices) is 1: one host synchronisation; True for no flags."""
    if not flags:
        return True
    if len(flags) > 1:   # one flag per device: combined on the first one
        ctx = flags[0].context
        flags = [nd.min(nd.concat(*[f.as_in_context(ctx) for f in flags], dim=0))]
    return bool(flags[0].asscalar() > 0)


def finite_flag(arrays, flag=None):
    """A float32 NDArray of shape (1,) on the device of ``arrays`` (non-empty list of NDArray
    of one device, any dtype or storage; integer ones are ignored): ``flag`` (default: a new
    one, 1) set to 0 if an array holds inf or NaN, without a host synchronisation. bfloat16
    arrays (``multi_all_finite`` has no bfloat16 kernel) are checked through float32 copies
    made :data:`UPDATE_GROUP` at a time, so the copies of all of them never exist at once."""
    groups = {}
    for g in arrays:
        if g.stype == 'row_sparse':
            g = g.data
        name = dtype_name(g.dtype)
        if name not in _FINITE_DTYPES and name != 'bfloat16':
            continue   # integer arrays cannot hold inf/NaN
        groups.setdefault(name, []).append(g)
    if flag is None:
        flag = nd.ones((1,), ctx=arrays[0].context, dtype='float32')
    for name, members in groups.items():
        size = UPDATE_GROUP if name == 'bfloat16' else MAX_FINITE_ARRAYS
        chunks = [members[start:start + size] for start in range(0, len(members), size)]
        buffer = None
        if name == 'bfloat16':   # one buffer, reused by every chunk (_float32_views)
            buffer = nd.empty((max(sum(g.size for g in c) for c in chunks),),
                              ctx=flag.context, dtype='float32')
        for chunk in chunks:
            if buffer is not None:
                chunk = _float32_views(chunk, buffer)
            nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=False, out=flag)
    return flag


def warn_forward_nonfinite(stacklevel):
    """Warn NonFiniteForwardWarning: a skipped step whose losses were inf/NaN."""
    warnings.warn(NonFiniteForwardWarning(
        'the forward pass gave inf/NaN (the loss or the outputs are not finite): the step is '
        'skipped, but this is not an overflow from loss scaling and a lower loss scale will '
        'not fix it; check the batch (inputs, labels), the learning rate, and '
        'log/exp/division/sqrt in the model'), stacklevel=stacklevel)


def param_grads(params):
    """The gradient arrays on every device of the Parameters that have one (a generator)."""
    for param in params:
        if param.grad_req != 'null' and param._grad is not None:
            yield from param.list_grad()


DeviceUpdate = collections.namedtuple('DeviceUpdate', ['indices', 'grads', 'weights',
                                                       'targets'])
DeviceUpdate.__doc__ = """The optimizer call of one device, lists aligned by position: the
optimizer ``indices``, the ``grads`` as the backward pass left them (any dtype), the
``weights`` the optimizer updates (a float32 master or the weight itself) and, for each, the
low-precision weight rewritten from its master after the update (``targets``; None: the weight
was updated in place). :meth:`Step.apply` runs it in groups (:func:`update_groups`)."""


def device_update(entries):
    """One device's :class:`DeviceUpdate` from ``(index, weight, grad, master)`` entries: a
    weight with a float32 master (None: updated in place) is updated through it, with its
    gradient cast to float32 when its group is updated, and rewritten from it afterwards."""
    indices, grads, weights, targets = [], [], [], []
    for index, weight, grad, master in entries:
        indices.append(index)
        grads.append(grad)
        weights.append(weight if master is None else master)
        targets.append(None if master is None else weight)
    return DeviceUpdate(indices, grads, weights, targets)


def update_groups(updater, update):
    """The consecutive slices of ``update`` (a :class:`DeviceUpdate`) that :meth:`Step.apply`
    hands ``updater`` one call each, so that the float32 copies of the low-precision gradients
    of one slice exist at a time (on BERT-base with ``cast_params=True`` all at once were 135
    MiB of peak RSS, docs/benchmark.md). Each slice is :data:`UPDATE_GROUP` weights rounded up
    to a multiple of the optimizer's ``aggregate_num`` when the updater aggregates (MXNet's
    Updater cuts a call into chunks of ``aggregate_num`` weights of one dtype, SGD counts each
    chunk's updates before reading its learning rates), so the optimizer sees the same chunks
    as in one call: the same kernels, learning rates and results. One slice, the whole list,
    when nothing is cast, the weights have several dtypes (MXNet then chunks per dtype) or the
    optimizer keeps references to its gradients (:data:`KEEPS_GRADIENTS`)."""
    n = len(update.indices)
    optimizer = getattr(updater, 'optimizer', None)
    if all(t is None for t in update.targets) or len({w.dtype for w in update.weights}) > 1 \
            or isinstance(optimizer, KEEPS_GRADIENTS):
        return [slice(0, n)]
    chunk = getattr(optimizer, 'aggregate_num', 0) if getattr(updater, 'aggregate_updates',
                                                              False) else 0
    size = -(-UPDATE_GROUP // chunk) * chunk if chunk and chunk > 0 else UPDATE_GROUP
    return [slice(start, start + size) for start in range(0, n, size)]


class Stage(enum.Enum):
    """``READY``: the gradients are scaled and the update divides by the scale; ``UNSCALED``:
    :meth:`Step.unscale` divided them already (as ``OptState`` in torch's grad_scaler.py)."""
    READY = 'ready'
    UNSCALED = 'unscaled'


class Step:
    """The state of one training loop between updates, and the update itself: ``scaler`` is
    a LossScaler (this Step's alone) or a LossScaleGroup whose member is ``owner`` (held
    weakly; None: the Step itself). The losses of every :meth:`scale_loss` since the last
    step (all micro-batches under gradient accumulation) are checked for inf/NaN on the
    device as they come, one flag per device (:func:`finite_flag`), read on an overflow."""

    def __init__(self, scaler, owner=None):
        self.group = scaler if isinstance(scaler, LossScaleGroup) else LossScaleGroup(scaler)
        self._owner = weakref.ref(self if owner is None else owner)   # no reference cycle
        self.group.join(self._owner())
        self.skipped_steps = 0
        self.stage = Stage.READY
        self._loss_flags = {}   # context -> finite_flag of this step's losses

    @property
    def scaler(self):
        """mxmp.LossScaler: the current loss scaler (replaced after every step)."""
        return self.group.current

    @scaler.setter
    def scaler(self, value):
        self.group.current = value

    def scale_loss(self, loss):
        """``loss`` times the loss scale (:func:`scale_losses`), its losses added to this
        step's finite check; ``loss`` itself when scaling is disabled."""
        scaler = self.scaler
        if not scaler.enabled:
            return loss
        per_device = {}
        for x in flatten_losses(loss):
            per_device.setdefault(x.context, []).append(x)
        with autograd.pause():
            for ctx, arrays in per_device.items():
                self._loss_flags[ctx] = finite_flag(arrays, self._loss_flags.get(ctx))
        return scale_losses(loss, float(scaler.scale))

    def unscale(self, grads):
        """Divide ``grads`` by the loss scale in place (inf/NaN stay for :meth:`check`); a
        no-op when scaling is disabled. RuntimeError if they were unscaled in this step.
        float16/bfloat16 gradients are divided in float32 (:func:`mxmp._src.scaling.divide`:
        MXNet would convert the scale to float16, where 2**16 is inf and every gradient 0)."""
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
                divide(grad, scale, out=grad)
        self.stage = Stage.UNSCALED

    def check(self, per_device_grads):
        """:func:`all_finite`, for a dynamic scaler only (else True, without a host sync)."""
        return not self.scaler.dynamic or all_finite(per_device_grads)

    def end(self, finite):
        """Close the step (``finite``: the result of :meth:`check`) in the group."""
        self.group.stepped(self._owner(), finite)
        if not finite:
            self.skipped_steps += 1
        self.stage = Stage.READY
        self._loss_flags = {}

    def apply(self, calls, optimizer, rescale_grad, name_of=None, forward_finite=None,
              on_kvstore=None):
        """Check for overflow, then run every ``(updater, DeviceUpdate)`` of ``calls`` with
        ``optimizer.rescale_grad = rescale_grad / loss_scale`` (no scale if disabled or
        UNSCALED), or skip the step; returns False if skipped. ``name_of``: optimizer index ->
        parameter name; ``forward_finite() -> bool`` (default: the losses of every
        :meth:`scale_loss` since the last step) is asked on an overflow only and warns
        NonFiniteForwardWarning if False. LossScaleAtFloorError when the scale is stuck at its floor: the step has then
        been skipped like any overflowing one (counted in :attr:`skipped_steps`, the stage
        READY again, the step told to the group, so the other members of a LossScaleGroup step
        on without "already stepped"), and the error is raised instead of returning False.
        ``on_kvstore``: None, or ``(per-device gradient lists, push)`` for a Trainer whose
        kvstore updates the weights (sparse weights, as gluon.Trainer): those gradients are
        checked too and ``push()`` (which makes the kvstore update) runs after ``calls``."""
        flags, self._loss_flags = list(self._loss_flags.values()), {}
        if forward_finite is None and flags:
            forward_finite = lambda: flags_finite(flags)  # noqa: E731
        scaler = self.scaler
        checked = [u.grads for _, u in calls] + (list(on_kvstore[0]) if on_kvstore else [])
        if not self.check(checked):
            new = scaler.adjust(False)
            forward_nonfinite = None if forward_finite is None else not forward_finite()
            if forward_nonfinite:
                warn_forward_nonfinite(stacklevel=4)
            if getattr(new, 'stuck_at_floor', False):
                names = sorted({str((name_of or str)(i)) for _, u in calls
                                for i, grad in zip(u.indices, u.grads) if not all_finite([[grad]])})
                self.end(False)   # a skipped step, told to the group before raising
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
                if _fused_update(updater, update):
                    continue
                parts = update_groups(updater, update)
                buffer = _GradientCopies(update, parts)
                for part in parts:
                    _update_group(updater, update, part, buffer)
                if any(buffer.kind) and hasattr(updater, 'forget_arrays'):
                    updater.forget_arrays()   # its checks held the copies: free them now
                del buffer
            if on_kvstore:
                on_kvstore[1]()
        self.end(True)
        return True


def _float32_views(arrays, buffer):
    """Float32 copies of the dense ``arrays`` written into consecutive views of the float32
    ``buffer`` (1-D, large enough). A buffer reused by consecutive groups of copies makes MXNet's
    engine order each group's casts after the previous group's readers (a write-after-read on
    one array), so the copies of two groups never coexist. Copies made as new arrays were
    freed only when the engine got to their deletion, sometimes after the next group's casts
    had run (measured: all copies at once in some runs)."""
    out, offset = [], 0
    for a in arrays:
        view = buffer[offset:offset + a.size].reshape(a.shape)
        nd.amp_cast(a, dtype='float32', out=view)
        out.append(view)
        offset += a.size
    return out


class _GradientCopies:
    """The float32 copies of the low-precision gradients of a :class:`DeviceUpdate` whose
    weights have float32 masters, one group (``parts``: slices of it) at a time, in one buffer
    sized for the largest group (:func:`_float32_views`), freed with this object."""

    def __init__(self, update, parts):
        self.update = update
        # per position: 'dense' (a float32 copy in the buffer), 'sparse' (a new array) or None
        self.kind = [None if t is None or dtype_name(g.dtype) == 'float32' else
                     'dense' if g.stype == 'default' else 'sparse'
                     for g, t in zip(update.grads, update.targets)]
        size = max((sum(g.size for g, k in zip(update.grads[part], self.kind[part])
                        if k == 'dense') for part in parts), default=0)
        self.array = nd.empty((size,), ctx=update.grads[0].context, dtype='float32') \
            if size else None

    def grads(self, part):
        """The gradients of the slice ``part`` as the optimizer takes them: float32 copies
        for the low-precision ones whose weight has a master (in the buffer; a sparse one as a
        new array), the rest as they are."""
        pairs = list(zip(self.update.grads[part], self.kind[part]))
        dense = [g for g, k in pairs if k == 'dense']
        views = iter(_float32_views(dense, self.array) if dense else [])
        # a row_sparse gradient stays sparse (amp_cast makes it dense: weight decay and
        # momentum then reached rows that were not in the batch)
        return [g if k is None else next(views) if k == 'dense' else
                cast_keeping_storage(g, 'float32') for g, k in pairs]


def _fused_update(updater, update):
    """Run ``update`` (a :class:`DeviceUpdate` with some master weights) in one pass of
    ``updater.update_with_targets`` (mxmp's Updater: the masters, their optimizer state and
    their bfloat16 weights together, the bfloat16 gradients read as they are, no float32
    copies); False where the updater has no such pass or declines it (the grouped update with
    float32 gradient copies then runs)."""
    if all(t is None for t in update.targets):
        return False   # nothing to rewrite: the updater's own call is already one pass
    fused = getattr(updater, 'update_with_targets', None)
    return fused is not None and fused(update.indices, update.grads, update.weights,
                                       update.targets)


def _update_group(updater, update, part, buffer):
    """One optimizer call over the slice ``part`` of ``update``: the low-precision gradients of
    master weights cast to float32 into ``buffer`` (a :class:`_GradientCopies`), then each
    low-precision weight rewritten from its updated master."""
    indices = update.indices[part]
    if not indices:
        return
    updater(indices, buffer.grads(part), update.weights[part])
    for master, weight in zip(update.weights[part], update.targets[part]):
        if weight is not None:
            nd.amp_cast(master, dtype=weight.dtype, out=weight)
