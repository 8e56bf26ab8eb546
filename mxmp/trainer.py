"""A Gluon Trainer with loss scaling, an overflow check and float32 master weights.

:class:`Trainer` is ``mxnet.gluon.Trainer`` (MXNet 1.9.1, ``python/mxnet/gluon/trainer.py``)
plus the three pieces of mixed-precision training described by Micikevicius et al., "Mixed
Precision Training", ICLR 2018, and NVIDIA's "Training With Mixed Precision" guide:

1. **loss scaling** (:meth:`Trainer.scale_loss`, :mod:`mxmp.scaler`): the loss is multiplied by
   the loss scale ``S`` before ``backward``; the optimizer's ``rescale_grad`` divides by ``S``;
2. **overflow check**: with a dynamic scaler every reduced gradient on every device is checked
   for inf/NaN (``mx.nd.multi_all_finite``) before the update; on overflow the update is
   skipped entirely and the scale backs off;
3. **float32 master weights**: for every float16 or bfloat16 Parameter the Trainer keeps a
   float32 copy per device, the optimizer updates that copy with the float32 gradient, and the
   low-precision Parameter is rewritten from it (``nd.amp_cast``). This works for bfloat16,
   where MXNet's own optimizers fail ("Unknown type enum 12"), and for any optimizer.

Typical loop (as with ``mxnet.contrib.amp``)::

    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    with autograd.record():
        loss = loss_fn(net(x), y)
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()
    trainer.step(batch_size)          # returns False if the step was skipped

The update itself (overflow check, master weights, the skipped or applied step) is
:mod:`mxmp.update`, shared with :class:`mxmp.module.Module`.

Differences from ``gluon.Trainer``: ``update_on_kvstore`` is always False (the Trainer must see
the reduced gradients to check them before the update; gluon's default on a kvstore is True, so
the Trainer logs that it turned it off), and ``step``/``update`` return whether the update was
applied. With a kvstore the gradients are reduced first (every worker pulls the same sum), so
the one overflow check that follows reaches the same answer on every worker: all workers skip
the same steps and keep the same loss scale without exchanging a flag. The gradient exchange
dtype (``grad_dtype``) is :mod:`mxmp.exchange`.
"""
import contextlib
import hashlib
import logging
import os
import pickle
import struct
import weakref

import numpy as np
from mxnet import autograd, gluon, nd

from . import exchange as _exchange
from .dtypes import LOW_PRECISION_DTYPES as _LOW_PRECISION, dtype_name as _dtype_name
from .dtypes import normalize_dtype
from .layout import to_default_layout
from .scaling.scalers import LossScaler, make_loss_scaler
from .training.checkpoint import write_atomic
from .training.master_weights import device_update
from .training.step import Stage, Step, param_grads

__all__ = ['Trainer']

logger = logging.getLogger(__name__)

#: Header of the states file written by :meth:`Trainer.save_states`.
_MAGIC = b'MXMP-TRAINER-STATES\x00'
_FORMAT_VERSION = 1
_HEADER = struct.Struct('<Q32s')   # payload length, sha256 of the payload


class Trainer(gluon.Trainer):
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
        loss_scaler (keyword-only): anything :func:`mxmp.scaler.make_loss_scaler` accepts;
            default None = dynamic scaling for float16, none for bfloat16/float32. Trainers
            given the same :class:`~mxmp.LossScaler` object share one loss scale, updated once
            per iteration as PyTorch's GradScaler shared by several optimizers
            (:mod:`mxmp.shared_scale`: each Trainer skips only its own step on overflow; the
            scale changes once every Trainer of the group has stepped).
        target_dtype (keyword-only, str or None): ``'float16'``, ``'bfloat16'`` or
            ``'float32'``; decides the default loss scaler. None: ``'float16'`` if any
            Parameter has dtype float16, else ``'bfloat16'`` if any has dtype bfloat16, else the
            ``_mxmp_target_dtype`` attribute that ``mxmp.convert`` sets on the Parameters of a
            converted block (float16 first), else ``'float32'``.
        grad_dtype (keyword-only, None or str): the *exchange dtype* of the gradients on the
            kvstore (:mod:`mxmp.exchange`): ``'float32'``, ``'float16'`` (needs a dynamic loss
            scaler: half the bytes, float16 rounding of each worker's gradient and of the sum)
            or ``'bfloat16'`` (local/device kvstores only). None (default): each gradient's own
            dtype, except bfloat16 gradients on a dist kvstore, which travel as float32 (MXNet's
            parameter server aborts on bfloat16). The reduced gradient is cast back to the
            gradient's dtype before the overflow check. No effect without a kvstore.

    Raises:
        ValueError: ``update_on_kvstore=True``, an async kvstore, an unknown ``target_dtype``,
            ``loss_scaler`` or ``grad_dtype`` (see :func:`mxmp.exchange.check_grad_dtype`);
            plus everything ``gluon.Trainer`` raises.

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

    With :class:`mxmp.scaler.NoOpLossScaler` and no float16/bfloat16 Parameters the Trainer
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
        if update_on_kvstore:
            raise ValueError(
                'mxmp.Trainer cannot update on the kvstore (update_on_kvstore=True): it must '
                'see the reduced gradients to check them for inf/NaN and to update the float32 '
                'master weights before the optimizer runs. Pass update_on_kvstore=None or False '
                '(the gradients are still reduced by the kvstore).')
        kv_type = kvstore if isinstance(kvstore, str) else getattr(kvstore, 'type', '')
        if 'async' in (kv_type or ''):
            raise ValueError(
                'mxmp.Trainer does not support the asynchronous kvstore %r: async training '
                'updates on the kvstore, where overflow cannot be checked. Use a synchronous '
                "kvstore ('device', 'local', 'dist_sync', 'dist_device_sync')." % (kv_type,))
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=kvstore,
                         compression_params=compression_params, update_on_kvstore=False)
        if target_dtype is None:
            target_dtype = self._infer_target_dtype()
        self._target_dtype = normalize_dtype(target_dtype, allow_float32=True)
        self._step = Step(make_loss_scaler(loss_scaler, self._target_dtype), self,
                          shared=isinstance(loss_scaler, LossScaler))
        self._asked_update_on_kvstore = update_on_kvstore
        self._grad_dtype = _exchange.check_grad_dtype(grad_dtype, kv_type,
                                                      self._loss_scaler.dynamic)
        self._exchange = _exchange.GradientExchange(len(self._params))
        self._masters = self._step.masters   # by param index (read by mxmp.block_params)
        if 'dist' in (kv_type or '') and all(p._data is not None for p in self._params):
            # Broadcast worker 0's values now, so that every worker's first forward uses them.
            self._prepare()

    # ------------------------------------------------------------------ properties
    @property
    def _loss_scaler(self):
        # the current scaler lives in the (possibly shared) group: mxmp.scaling.shared
        return self._step.scaler

    @_loss_scaler.setter
    def _loss_scaler(self, scaler):
        self._step.scaler = scaler

    @property
    def loss_scaler(self) -> LossScaler:
        """LossScaler: the current loss scaler (replaced after every step; shared with the
        other Trainers given the same scaler object, see :mod:`mxmp.shared_scale`)."""
        return self._loss_scaler

    @property
    def loss_scale(self) -> float:
        """float: the current loss scale ``S`` (1.0 when scaling is disabled)."""
        return float(self._loss_scaler.scale)

    @property
    def skipped_steps(self) -> int:
        """int: number of steps skipped because a gradient was inf/NaN."""
        return self._step.skipped_steps

    @property
    def target_dtype(self) -> str:
        """str: ``'float16'``, ``'bfloat16'`` or ``'float32'`` (see the class docstring)."""
        return self._target_dtype

    # ------------------------------------------------------------------ helpers
    def _infer_target_dtype(self):
        names = set()
        for param in self._params:
            try:
                names.add(_dtype_name(param.dtype))
            except TypeError:
                pass
        for name in _LOW_PRECISION:
            if name in names:
                return name
        marks = {getattr(p, '_mxmp_target_dtype', None) for p in self._params}
        for name in _LOW_PRECISION:
            if name in marks:
                return name
        return 'float32'

    def _is_low_precision(self, param):
        return param.grad_req != 'null' and _dtype_name(param.dtype) in _LOW_PRECISION

    def _prepare(self):
        if not self._kv_initialized:
            self._init_kvstore()
        if self._params_to_init:
            self._init_params()

    def _init_kvstore(self):
        super()._init_kvstore()
        if self._kvstore is not None and getattr(self, '_asked_update_on_kvstore', 0) is None:
            logger.info('mxmp.Trainer: update_on_kvstore=False on the %r kvstore (gluon\'s '
                        'default there is True): the kvstore only reduces the gradients; every '
                        'worker checks the reduced gradients for overflow and updates its own '
                        'weights', self._kvstore.type)

    def _init_params(self):
        # gluon.Trainer broadcasts worker 0's initial weights lazily, at the first step, with an
        # *asynchronous* pull on key i, and then pushes and pulls the gradient on the same key i.
        # The two touch different NDArrays, so MXNet's engine does not order them; on a dist
        # kvstore the server's value of key i is the initial weight until the first gradient
        # round completes and the gradient sum afterwards, so a weight pull served late writes
        # the *summed gradient into the weight* (the flaky "workers differ" failure of issue 6).
        # Waiting for the broadcast before any gradient is pushed makes every pull see the
        # weights: no worker pushes a gradient of key i before its own pull of key i returned.
        # The broadcast goes through a fresh host copy in the kvstore's dtype, not the live weight
        # array as in gluon: bfloat16 would abort the parameter server (float32 travels instead),
        # and after a forward pass a weight held in oneDNN's layout was never stored by the
        # server ("init 4 first" from kvstore_dist_server.h, with gluon.Trainer as well).
        kv, todo = self._kvstore, [p for p in self._params_to_init if not p._deferred_init]
        if kv is not None and self._distributed:
            rest = []
            for param in self._params_to_init:
                if param._deferred_init or param._stype != 'default':
                    rest.append(param)
                    continue
                arrays, idx = param.list_data(), self._param2idx[param.name]
                own = _dtype_name(param.dtype)
                with autograd.pause():
                    to_default_layout(arrays[0])   # amp_cast fails on reordered grouped weights
                    host = (nd.amp_cast(arrays[0], dtype='float32') if own == 'bfloat16'
                            else arrays[0]).asnumpy()
                    wire = nd.array(host, dtype=_exchange.wire_dtype(own, kv.type))
                    kv.init(idx, wire)
                    kv.pull(idx, out=wire)
                    for arr in arrays:
                        nd.amp_cast(wire.as_in_context(arr.context), dtype=arr.dtype, out=arr)
            self._params_to_init = rest
        super()._init_params()
        for param in todo:
            for arr in param.list_data():
                arr.wait_to_read()

    def _allreduce_grads(self):
        kv = self._kvstore
        if not kv:
            return
        for i, param in enumerate(self._params):
            if param.grad_req == 'null':
                continue
            grads = param.list_grad()
            own = _dtype_name(param.dtype)
            dtype = self.exchange_dtype(param)
            if grads[0].stype != 'default':   # as gluon.Trainer (sparse: own dtype only)
                kv.push(i, grads, priority=-i)
                if param._stype == 'default':
                    kv.pull(i, grads, priority=-i, ignore_sparse=self._distributed)
            elif dtype == own:
                kv.pushpull(i, grads, priority=-i)
            else:
                self._exchange.pushpull(kv, i, grads, dtype,
                                        _exchange.wire_dtype(own, kv.type) == dtype, -i)

    # ------------------------------------------------------------------ gradient exchange
    @property
    def num_workers(self) -> int:
        """int: number of workers of the kvstore (1 without a kvstore). Creates the kvstore."""
        if not self._kv_initialized:
            self._init_kvstore()
        return self._kvstore.num_workers if self._kvstore else 1

    def exchange_dtype(self, param):
        """The dtype a Parameter's gradient travels in over the kvstore (see ``grad_dtype``).

        Args:
            param (Parameter or str): a Parameter of this Trainer, or its name.

        Returns:
            str: ``'float32'``, ``'float16'`` or ``'bfloat16'``; the gradient's own dtype when
            there is no kvstore (nothing is exchanged).

        Raises:
            ValueError: the Parameter is not in this Trainer.
        """
        p = self._params[self._param_index(param)]
        if not self._kv_initialized:
            self._init_kvstore()
        own = _dtype_name(p.dtype)
        if not self._kvstore:
            return own
        return _exchange.exchange_dtype(own, self._grad_dtype, self._kvstore.type)

    def bytes_pushed_per_step(self):
        """Gradient bytes this worker pushes to the kvstore per step (0 without a kvstore).

        The sum over Parameters with ``grad_req != 'null'`` of elements x bytes per element of
        :meth:`exchange_dtype`: what one worker sends after its devices' gradients are summed
        (``dist_sync`` pulls the same amount back). Parameters whose shape is not known yet
        (deferred initialisation) count 0.
        """
        if not self._kv_initialized:
            self._init_kvstore()
        if not self._kvstore:
            return 0
        return int(sum(int(np.prod(p.shape)) * _exchange.itemsize(self.exchange_dtype(p))
                       for p in self._params if p.grad_req != 'null'))

    def _ensure_master(self, i, param):
        """Return the float32 master weights of Parameter ``i`` (one per device)."""
        # Lets a converted block's save_parameters/load_parameters (mxmp.block_params) write
        # and set the exact float32 master instead of the stored low-precision rounding.
        param._mxmp_trainer = weakref.ref(self)
        return self._masters.get(i, param.list_data())

    def _ensure_all_masters(self):
        for i, param in enumerate(self._params):
            if self._is_low_precision(param) and param._data is not None:
                self._ensure_master(i, param)

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
                             'grad_req %r)' % (p.name, _dtype_name(p.dtype), p.grad_req))
        return self._ensure_master(i, p)

    def reset_master_weights(self):
        """Re-create every master weight from the current low-precision Parameter values.

        Call after changing a float16/bfloat16 Parameter in place (``set_data``,
        ``load_parameters``) once training has started. Optimizer states are kept.
        """
        self._masters.clear()
        self._ensure_all_masters()

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
        if self._loss_scaler.enabled and not autograd.is_recording():
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
                (:mod:`mxmp.shared_scale`); nothing is updated.
            UserWarning: (raised, as gluon.Trainer does) a stale gradient without
                ``ignore_stale_grad``.
            mxmp.update.LossScaleAtFloorError: a dynamic loss scale stayed at its floor for
                ``max_overflows_at_floor`` consecutive overflows (the message names the
                Parameters whose gradients were inf/NaN); nothing is updated.

        Warns:
            mxmp.update.NonFiniteForwardWarning: the step is skipped and the loss given to
                :meth:`scale_loss` was itself inf/NaN (a NaN in the forward pass, not an
                overflow from scaling). Checked only on skipped steps: no extra host sync.

        Cost: see the class docstring (one host sync with a dynamic loss scaler).
        """
        self._check_batch_size(batch_size)
        self._step.check_can_step()
        self._prepare()
        self._allreduce_grads()
        return self._apply_update(batch_size, ignore_stale_grad)

    def update(self, batch_size, ignore_stale_grad=False):
        """Second half of a split step: check the (already reduced) gradients and update.

        Use after :meth:`allreduce_grads` (and optionally :meth:`unscale` and clipping), as in
        ``gluon.Trainer``. Arguments, return value, errors and costs as :meth:`step`.
        """
        self._check_batch_size(batch_size)
        self._step.check_can_step()
        self._prepare()
        return self._apply_update(batch_size, ignore_stale_grad)

    @staticmethod
    def _check_batch_size(batch_size):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, float, np.number)) \
                or not batch_size > 0:
            raise ValueError('batch_size must be a positive number, got %r' % (batch_size,))

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

    # ------------------------------------------------------------------ checkpoints
    def _param_records(self):
        return [{'name': p.name, 'shape': [int(s) for s in p.shape],
                 'dtype': _dtype_name(p.dtype), 'master': self._is_low_precision(p)}
                for p in self._params]

    def save_states(self, fname):
        """Save optimizer states, master weights, loss scaler and skipped_steps to ``fname``.

        The file is written atomically: a temporary file in the same directory, flushed and
        fsynced, then ``os.replace``d over ``fname``; a crash leaves the old file intact.
        Format: a header (magic, payload length, SHA-256 of the payload) and a pickled payload
        (MXNet's own ``Trainer.save_states`` pickles too: load only files you trust). Holds the
        optimizer (with its update counts and learning-rate schedule) and the states of the
        first device, as ``gluon.Trainer.save_states`` does: with reduced gradients every
        device holds the same states. Model parameters are not included: save them with
        ``net.save_parameters`` at the same step.

        Args:
            fname (str): path of the states file.

        Cost: copies every optimizer state and master weight to host memory (host sync).
        """
        self._prepare()
        self._ensure_all_masters()
        masters = self._masters.to_numpy()
        payload = pickle.dumps({
            'format': 'mxmp.Trainer', 'version': _FORMAT_VERSION,
            'params': self._param_records(),
            'optimizer': self._updaters[0].get_states(dump_optimizer=True),
            'master_weights': masters,
            'loss_scaler': self._loss_scaler.state_dict(),
            'skipped_steps': self._step.skipped_steps,
            'target_dtype': self._target_dtype,
        }, protocol=4)
        blob = _MAGIC + _HEADER.pack(len(payload), hashlib.sha256(payload).digest()) + payload
        write_atomic(fname, blob)

    def _read_states(self, fname):
        with open(fname, 'rb') as fin:
            blob = fin.read()
        if not blob.startswith(_MAGIC):
            hint = (' (it looks like a pickle, e.g. from gluon.Trainer.save_states)'
                    if blob[:1] == b'\x80' else '')
            raise ValueError('%s is not an mxmp Trainer states file: bad header%s'
                             % (fname, hint))
        head = blob[len(_MAGIC):len(_MAGIC) + _HEADER.size]
        if len(head) < _HEADER.size:
            raise ValueError('%s is truncated: the header is incomplete' % fname)
        length, digest = _HEADER.unpack(head)
        payload = blob[len(_MAGIC) + _HEADER.size:]
        if len(payload) != length:
            raise ValueError('%s is truncated or has trailing data: payload is %d bytes, the '
                             'header says %d' % (fname, len(payload), length))
        if hashlib.sha256(payload).digest() != digest:
            raise ValueError('%s is corrupt: the SHA-256 of its payload does not match the '
                             'header' % fname)
        try:
            state = pickle.loads(payload)
            opt_states = pickle.loads(state['optimizer'])
        except Exception as err:  # pylint: disable=broad-except
            raise ValueError('%s cannot be decoded: %s' % (fname, err)) from None
        if not isinstance(state, dict) or state.get('format') != 'mxmp.Trainer':
            raise ValueError('%s is not an mxmp Trainer states file' % fname)
        if state.get('version') != _FORMAT_VERSION:
            raise ValueError('%s has format version %r; this mxmp reads version %d'
                             % (fname, state.get('version'), _FORMAT_VERSION))
        if not (isinstance(opt_states, tuple) and len(opt_states) == 2):
            raise ValueError('%s holds no optimizer (was it saved by mxmp.Trainer?)' % fname)
        return state

    def _check_params(self, fname, saved, check_names):
        mine = self._param_records()
        if len(saved) != len(mine):
            raise ValueError('%s holds states for %d Parameters but this Trainer has %d'
                             % (fname, len(saved), len(mine)))
        for k, (s, m) in enumerate(zip(saved, mine)):
            if check_names and s['name'] != m['name']:
                raise ValueError('%s: Parameter %d is %r in the file but %r here (build the '
                                 'network with the same prefixes, or pass check_names=False)'
                                 % (fname, k, s['name'], m['name']))
            if list(s['shape']) != m['shape'] and 0 not in m['shape']:
                raise ValueError('%s: Parameter %d (%s) has shape %s in the file but %s here'
                                 % (fname, k, m['name'], tuple(s['shape']), tuple(m['shape'])))
            if s['master'] and m['master'] and s['dtype'] != m['dtype']:
                raise ValueError('%s: Parameter %d (%s) is %s in the file but %s here: the states '
                                 'come from a run with another target dtype; convert the '
                                 'network to %s as in that run, or start the optimizer afresh'
                                 % (fname, k, m['name'], s['dtype'], m['dtype'], s['dtype']))
            if s['master'] != m['master']:
                raise ValueError('%s: Parameter %d (%s) is %s in the file but %s here: master '
                                 'weights exist only for float16/bfloat16 Parameters; cast the '
                                 'network as in the run that saved the file'
                                 % (fname, k, m['name'], s['dtype'], m['dtype']))

    def load_states(self, fname, check_names=True):
        """Load what :meth:`save_states` wrote: all of it, or nothing.

        Everything is read and validated before anything changes: on any error the Trainer is
        untouched.

        Args:
            fname (str): path written by :meth:`save_states`.
            check_names (bool): require the Parameter names to match the file (default True).
                Gluon names carry per-process counters (``dense0_``, ``dense1_``); pass False to
                match Parameters by position only (count, shapes and dtypes are still checked).

        Raises:
            ValueError: the file is not an mxmp states file, is truncated or corrupt (SHA-256
                mismatch), or does not match this Trainer: another number of Parameters, other
                names (with ``check_names``), shapes or low-precision dtypes, or another loss
                scaler class/configuration. The message names the problem.
            OSError: the file cannot be read.
        """
        fname = os.fspath(fname)
        state = self._read_states(fname)
        try:
            saved_params = state['params']
            masters = state['master_weights']
            scaler_state = state['loss_scaler']
            skipped = int(state['skipped_steps'])
            opt_blob = state['optimizer']
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError('%s misses a field: %s' % (fname, err)) from None
        try:
            self._check_params(fname, saved_params, check_names)
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError('%s: malformed Parameter records: %r' % (fname, err)) from None
        records = self._param_records()
        for i, rec in enumerate(records):
            if not rec['master']:
                continue
            arr = masters.get(i) if isinstance(masters, dict) else None
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or \
                    (0 not in rec['shape'] and list(arr.shape) != rec['shape']):
                raise ValueError('%s: the master weight of Parameter %d (%s) is missing or has '
                                 'the wrong shape/dtype' % (fname, i, rec['name']))
        scaler = self._loss_scaler.load_state_dict(scaler_state)

        # Validated: apply.
        self._prepare()
        for updater in self._updaters:
            updater.set_states(opt_blob)
            updater.optimizer = self._updaters[0].optimizer
        self._optimizer = self._updaters[0].optimizer
        self._optimizer.param_dict = {i: p for i, p in enumerate(self._params)}
        self._masters.clear()
        for i, rec in enumerate(records):
            if rec['master']:
                self._masters.set_pending(i, masters[i])
        self._ensure_all_masters()
        self._loss_scaler = scaler
        self._step.skipped_steps = skipped
        self._step.stage = Stage.READY
