"""A Gluon Trainer with loss scaling, an overflow check and float32 master weights.

:class:`Trainer` is ``mxnet.gluon.Trainer`` (MXNet 1.9.1, ``python/mxnet/gluon/trainer.py``)
plus the three pieces of mixed-precision training (Micikevicius et al., "Mixed Precision
Training", ICLR 2018; NVIDIA's "Training With Mixed Precision" guide): loss scaling
(:mod:`mxmp._src.scaling.scalers`), the overflow check with skipped steps, and float32 master
weights, which also work for bfloat16, where MXNet's optimizers fail ("Unknown type enum 12").
It drives the one training step (:mod:`mxmp._src.training.step`, shared with :class:`mxmp.Module`
and :mod:`mxmp.amp`); its kvstore glue is :mod:`mxmp._src.distributed.kvstore` (gradient exchange
dtypes: :mod:`mxmp._src.distributed.exchange`), its states file :mod:`mxmp._src.training.checkpoint`,
its master-weight API :mod:`mxmp._src.training.master_weights`. Typical loop (as with
``mxnet.contrib.amp``)::

    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    with autograd.record():
        loss = loss_fn(net(x), y)
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()
    trainer.step(batch_size)          # returns False if the step was skipped

Differences from ``gluon.Trainer``: ``update_on_kvstore`` is always False (the Trainer must see
the reduced gradients to check them before the update), and ``step``/``update`` return whether
the update was applied. With a kvstore the gradients are reduced first, so the one overflow
check that follows reaches the same answer on every worker: all workers skip the same steps
and keep the same loss scale without exchanging a flag.
"""
import contextlib

import numpy as np
from mxnet import autograd, gluon

from ..distributed import exchange as _exchange
from ..distributed.kvstore import KVStoreMixin, check_kvstore_args
from ..dtypes import LOW_PRECISION_DTYPES as _LOW_PRECISION, dtype_name as _dtype_name
from ..dtypes import normalize_dtype
from ..scaling.scalers import LossScaler, make_loss_scaler
from .checkpoint import StatesFileMixin
from .master_weights import MasterWeightsMixin, device_update
from .step import Step, StepOwnerMixin, param_grads
from .updater import Updater

__all__ = ['Trainer']


class Trainer(StepOwnerMixin, KVStoreMixin, StatesFileMixin, MasterWeightsMixin, gluon.Trainer):
    """``gluon.Trainer`` with loss scaling, an overflow check and float32 master weights.

    Args:
        params (ParameterDict, dict or list of Parameter): the Parameters to optimize, as for
            ``gluon.Trainer``. Any dtype; float16/bfloat16 ones get float32 master weights.
        optimizer (str or mx.optimizer.Optimizer): as for ``gluon.Trainer`` (sgd, nag, adam,
            ...). ``multi_precision=True`` is accepted but has no effect on float16/bfloat16
            Parameters: the optimizer only ever sees their float32 master weights (mxmp's
            master weights replace MXNet's, and also work for bfloat16).
        optimizer_params (dict or None): optimizer keyword arguments (``learning_rate``,
            ``momentum``, ``wd``, ``rescale_grad``, ``clip_gradient`` ...). ``clip_gradient``
            applies to the unscaled gradient (the optimizer multiplies by ``rescale_grad``
            first).
        kvstore (str or KVStore): as for ``gluon.Trainer``; default ``'device'``. Asynchronous
            kvstores are refused (they need ``update_on_kvstore=True``).
        compression_params (dict or None): as for ``gluon.Trainer``.
        update_on_kvstore (None or False): must not be True (ValueError): mxmp checks the
            reduced gradients for overflow and updates master weights before the update, which
            an update on the kvstore would bypass. None means False (logged at INFO when a
            kvstore is created, since gluon's default there is True).
        loss_scaler (keyword-only): anything :func:`mxmp.make_loss_scaler` accepts;
            default None = dynamic scaling for float16, none for bfloat16/float32. Trainers
            given the same :class:`~mxmp.LossScaler` object share one loss scale, updated once
            per iteration as PyTorch's GradScaler shared by several optimizers
            (:mod:`mxmp._src.scaling.shared`: each Trainer skips only its own step on overflow; the
            scale changes once every Trainer of the group has stepped).
        target_dtype (keyword-only, str or None): ``'float16'``, ``'bfloat16'`` or
            ``'float32'``; decides the default loss scaler. None: ``'float16'`` if any
            Parameter has dtype float16, else ``'bfloat16'`` if any has dtype bfloat16, else the
            target dtype of the network ``mxmp.convert`` or ``mxmp.amp.init`` converted (float16 first), else ``'float32'``.
        grad_dtype (keyword-only, None or str): the *exchange dtype* of the gradients on the
            kvstore (:mod:`mxmp._src.distributed.exchange`): ``'float32'``, ``'float16'`` (needs a
            dynamic loss scaler: half the bytes, float16 rounding of each worker's gradient and
            of the sum) or ``'bfloat16'`` (local/device kvstores only). None (default): each
            gradient's own dtype, except bfloat16 gradients on a dist kvstore, which travel as
            float32 (MXNet's parameter server aborts on bfloat16). The reduced gradient is cast
            back to the gradient's dtype before the overflow check. No effect without a kvstore.

    Raises:
        ValueError: ``update_on_kvstore=True``, an async kvstore, an unknown ``target_dtype``,
            ``loss_scaler`` or ``grad_dtype`` (see
            :func:`mxmp._src.distributed.exchange.check_grad_dtype`); plus everything
            ``gluon.Trainer`` raises.

    Behaviour of :meth:`step` (and of :meth:`update` after :meth:`allreduce_grads`):

    * with a dynamic loss scaler: one overflow check over every gradient that is about to be
      applied, on every device, after the reduction across devices/workers (so every worker
      skips the same steps). Cost: one ``multi_all_finite`` per 200 arrays per dtype per
      device, one float copy per extra device, and **one host synchronisation per step**
      (the check's result decides on the host whether to update). On overflow: no weight,
      master weight, optimizer state or optimizer update count changes; the scale backs off;
      ``skipped_steps`` grows by one; the gradients count as consumed (stale);
    * otherwise ``rescale_grad = rescale_grad0 / (loss_scale * batch_size)`` (without
      ``loss_scale`` if :meth:`unscale` ran this step), where ``rescale_grad0`` is the
      optimizer's ``rescale_grad`` at construction (default 1);
    * float16/bfloat16 Parameters: per device the gradient is cast to float32 (a temporary
      array), the optimizer updates the float32 master weight (its state, e.g. momentum, is
      float32 too), and the Parameter is rewritten as ``amp_cast(master, dtype)``. Extra memory
      per such Parameter and device: the float32 master (4 bytes per element) and float32
      optimizer state. No host synchronisation.

    With :class:`mxmp.NoOpLossScaler` and no float16/bfloat16 Parameters the Trainer
    computes exactly what ``gluon.Trainer(..., update_on_kvstore=False)`` computes.

    Master weights are created from the Parameters' values on first use (the first
    ``step``/``update``, :meth:`master_weights` or :meth:`save_states`), so
    ``load_parameters`` before the first step is safe. They are re-created if a Parameter's
    arrays are replaced (``param.cast``, ``reset_ctx``). After overwriting the values of a
    float16/bfloat16 Parameter in place later on (``set_data``, ``load_parameters``), call
    :meth:`reset_master_weights`, or the next update overwrites them from the old masters.
    """

    def __init__(self, params, optimizer, optimizer_params=None, kvstore='device',
                 compression_params=None, update_on_kvstore=None, *, loss_scaler=None,
                 target_dtype=None, grad_dtype=None):
        kv_type = check_kvstore_args(kvstore, update_on_kvstore)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=kvstore,
                         compression_params=compression_params, update_on_kvstore=False)
        if target_dtype is None:
            target_dtype = infer_target_dtype(self._params)
        self._target_dtype = normalize_dtype(target_dtype, allow_float32=True)
        self._step = Step(make_loss_scaler(loss_scaler, self._target_dtype), self,
                          shared=isinstance(loss_scaler, LossScaler))
        self._asked_update_on_kvstore = update_on_kvstore
        self._grad_dtype = _exchange.check_grad_dtype(grad_dtype, kv_type,
                                                      self._step.scaler.dynamic)
        self._exchange = _exchange.GradientExchange(len(self._params))
        self._masters = self._step.masters   # by param index (read by mxmp._src.block_params)
        if 'dist' in (kv_type or '') and all(p._data is not None for p in self._params):
            # Broadcast worker 0's values now, so that every worker's first forward uses them.
            self._prepare()

    # ------------------------------------------------------------------ properties
    # loss_scaler, loss_scale, skipped_steps: StepOwnerMixin
    @property
    def target_dtype(self) -> str:
        """str: ``'float16'``, ``'bfloat16'`` or ``'float32'`` (see the class docstring)."""
        return self._target_dtype

    def _init_optimizer(self, optimizer, optimizer_params):
        super()._init_optimizer(optimizer, optimizer_params)
        # SGD on a CPU: one weight per kernel call, same numbers, faster (training/updater.py)
        self._updaters = [Updater(self._optimizer) for _ in self._contexts]

    def _prepare(self):
        if not self._kv_initialized:
            self._init_kvstore()
        if self._params_to_init:
            self._init_params()

    # ------------------------------------------------------------------ loss scaling
    @contextlib.contextmanager
    def scale_loss(self, loss):
        """Context manager yielding the loss multiplied by the loss scale.

        Use it inside ``autograd.record()`` so that the multiplication is recorded, as with
        ``mxnet.contrib.amp.scale_loss``::

            with autograd.record():
                loss = loss_fn(net(x), y)
                with trainer.scale_loss(loss) as scaled:
                    scaled.backward()     # or autograd.backward(scaled) for a list

        Args:
            loss (NDArray, or a list/tuple of NDArrays nested to any depth): the loss(es), any
                float dtype.

        Yields:
            NDArray, or lists/tuples of the same nesting: ``loss * loss_scale`` (new arrays,
            same dtype); with scaling disabled (NoOpLossScaler) ``loss`` itself, no multiply.

        Raises:
            RuntimeError: scaling is enabled and autograd is not recording (the multiply would
                not be differentiated).
            TypeError: an element of ``loss`` is not an NDArray (the message says which).
        """
        if self._step.scaler.enabled and not autograd.is_recording():
            raise RuntimeError('scale_loss() must run inside autograd.record(): the multiply '
                               'by the loss scale has to be recorded for backward(). Put the '
                               '"with trainer.scale_loss(loss)" block inside the record scope.')
        # the step keeps the losses to tell a NaN in the forward pass from an overflow
        yield self._step.scale_loss(loss)

    def unscale(self):
        """Divide every gradient by the loss scale, in place (for gradient clipping).

        Call between ``backward`` and :meth:`step` (or between :meth:`allreduce_grads` and
        :meth:`update`), like PyTorch's ``GradScaler.unscale_``; the following step then leaves
        the loss scale out of ``rescale_grad``. Gradients are divided in their own dtype: for
        float16 gradients, values below 2**-24 after division flush to zero, so clip in float16
        only if you must. inf/NaN stay inf/NaN and the step's overflow check still sees them.
        A no-op when scaling is disabled. Cost: one division per gradient array, no host sync.

        Raises:
            RuntimeError: unscale() was already called since the last step()/update().
        """
        self._step.unscale(param_grads(self._params))

    # ------------------------------------------------------------------ stepping
    def step(self, batch_size, ignore_stale_grad=False):
        """Reduce the gradients, check them, and apply one update unless they overflowed.

        Call after ``backward`` and outside ``autograd.record()``.

        Args:
            batch_size (int or float): gradients are divided by it (as in gluon.Trainer); use 1
                if the loss is already a mean. Must be > 0.
            ignore_stale_grad (bool): as in gluon.Trainer: skip Parameters whose gradient was
                not refreshed by backward instead of raising.

        Returns:
            bool: True if the update was applied, False if it was skipped on overflow.

        Raises:
            ValueError: ``batch_size`` <= 0.
            RuntimeError: this Trainer shares its loss scaler with other Trainers and stepped
                already in this iteration while some of them have not
                (:mod:`mxmp._src.scaling.shared`); nothing is updated.
            UserWarning: (raised, as gluon.Trainer does) a stale gradient without
                ``ignore_stale_grad``.
            mxmp.LossScaleAtFloorError: a dynamic loss scale stayed at its floor for
                ``max_overflows_at_floor`` consecutive overflows (the message names the
                Parameters whose gradients were inf/NaN); nothing is updated.

        Warns:
            mxmp.NonFiniteForwardWarning: the step is skipped and the loss given to
                :meth:`scale_loss` was itself inf/NaN (a NaN in the forward pass, not an
                overflow from scaling). Checked only on skipped steps: no extra host sync.

        Cost: see the class docstring (one host sync with a dynamic loss scaler).
        """
        _check_batch_size(batch_size)
        self._step.check_can_step()
        self._prepare()
        self._allreduce_grads()
        return self._apply_update(batch_size, ignore_stale_grad)

    def update(self, batch_size, ignore_stale_grad=False):
        """Second half of a split step: check the (already reduced) gradients and update.

        Use after :meth:`allreduce_grads` (and optionally :meth:`unscale` and clipping), as in
        ``gluon.Trainer``. Arguments, return value, errors and costs as :meth:`step`.
        """
        _check_batch_size(batch_size)
        self._step.check_can_step()
        self._prepare()
        return self._apply_update(batch_size, ignore_stale_grad)

    def _update(self, ignore_stale_grad=False):
        # gluon.Trainer's private update would hand float16/bfloat16 weights to the optimizer
        # and bypass the overflow check: refuse it rather than update silently without them.
        raise RuntimeError('mxmp.Trainer updates through step() or update() only: they check '
                           'the gradients for overflow and update the master weights')

    def _collect(self, ignore_stale_grad):
        """Return, per device, the (index, param, data, grad) tuples to apply."""
        per_device = [[] for _ in self._updaters]
        for i, param in enumerate(self._params):
            if param.grad_req == 'null':
                continue
            data_list = param.list_data()
            if not ignore_stale_grad:
                for data in data_list:
                    if not data._fresh_grad:
                        raise UserWarning(
                            'Gradient of Parameter `%s` on context %s has not been updated by '
                            'backward since the last step. If only a subset of the Parameters '
                            'is used on purpose, call step with ignore_stale_grad=True to skip '
                            'the Parameters with stale gradients.' % (param.name, data.context))
            for dev, (data, grad) in enumerate(zip(data_list, param.list_grad())):
                if not ignore_stale_grad or data._fresh_grad:
                    per_device[dev].append((i, param, data, grad))
        return per_device

    def _apply_update(self, batch_size, ignore_stale_grad):
        with autograd.pause():
            per_device = self._collect(ignore_stale_grad)
            calls = []
            for dev, (updater, entries) in enumerate(zip(self._updaters, per_device)):
                calls.append((updater, device_update(
                    (i, data, grad,
                     self._ensure_master(i, param)[dev] if self._is_low_precision(param)
                     else None)
                    for i, param, data, grad in entries)))
            # The gradients count as consumed whether the step is applied or skipped.
            for entries in per_device:
                for _, _, data, _ in entries:
                    data._fresh_grad = False
            # one scale update per iteration of the group (alone: after every step)
            return self._step.apply(calls, self._optimizer, self._scale / batch_size,
                                    name_of=lambda i: self._params[i].name)


def infer_target_dtype(params):
    """The target dtype a Trainer over ``params`` (list of Parameter) defaults to: float16 if a
    Parameter is float16, else bfloat16 if one is, else the target dtype of the network
    converted by ``mxmp.convert`` or ``mxmp.amp.init`` (float16 first), else float32."""
    names = set()
    for param in params:
        try:
            names.add(_dtype_name(param.dtype))
        except TypeError:
            pass
    for name in _LOW_PRECISION:
        if name in names:
            return name
    from ..gluon import policy_of
    marks = {policy_of(p).target_dtype for p in params if policy_of(p)}
    for name in _LOW_PRECISION:
        if name in marks:
            return name
    return 'float32'


def _check_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, float, np.number)) \
            or not batch_size > 0:
        raise ValueError('batch_size must be a positive number, got %r' % (batch_size,))
