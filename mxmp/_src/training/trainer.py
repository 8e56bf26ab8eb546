"""mxmp.Trainer: ``gluon.Trainer`` with loss scaling, the overflow check and float32 master
weights. It owns its :class:`~mxmp._src.training.step.Step`, its
:class:`~mxmp._src.training.master_weights.ParameterMasters` and its
:class:`~mxmp._src.distributed.KVStoreExchange`; its states file is
:mod:`mxmp._src.training.checkpoint`. More in docs/training.md.
"""
import contextlib
import logging

import numpy as np
from mxnet import autograd, gluon

from .. import distributed
from ..dtypes import LOW_PRECISION_DTYPES, dtype_name, normalize_dtype
from ..policy.policy import Policy
from ..scaling import LossScaleGroup, make_loss_scaler
from . import checkpoint
from .master_weights import ParameterMasters, is_low_precision
from .step import Stage, Step, device_update, param_grads
from .updater import Updater

__all__ = ['Trainer', 'resolve_precision']

logger = logging.getLogger('mxmp.trainer')


class Trainer(gluon.Trainer):
    """``gluon.Trainer`` with loss scaling, an overflow check and float32 master weights.

    Args:
        params, optimizer, optimizer_params, compression_params: as for ``gluon.Trainer``;
            float16/bfloat16 Parameters get float32 master weights, which the optimizer
            updates (``multi_precision`` has no effect on them).
        kvstore (str or KVStore): as for ``gluon.Trainer`` (default ``'device'``); it only
            reduces gradients; asynchronous kvstores are refused.
        update_on_kvstore (None or False): True raises ValueError (the Trainer must see the
            reduced gradients to check them).
        loss_scaler (keyword-only): anything :func:`mxmp.make_loss_scaler` accepts, or a
            :class:`mxmp._src.scaling.LossScaleGroup` shared with other Trainers; default: the
            policy's, else dynamic for float16 and none otherwise.
        target_dtype (keyword-only, str or None): decides the default loss scaler. None: the
            policy's; else float16 if a Parameter is float16, else bfloat16 if one is; else
            the target dtype of the converted network of the Parameters; else float32.
        grad_dtype (keyword-only, None or str): the dtype gradients travel in over the
            kvstore (:func:`mxmp._src.distributed.check_grad_dtype`); None: their own, except
            bfloat16 on a dist kvstore (float32).
        policy (keyword-only, mxmp.Policy or None): where the target dtype and the loss scaler
            come from; default: the policy of the converted network of the Parameters.

    Raises:
        ValueError: ``update_on_kvstore=True``, an async kvstore, an unknown ``target_dtype``,
            ``loss_scaler`` or ``grad_dtype``, or ``target_dtype``/``loss_scaler`` that
            contradict ``policy``; plus what ``gluon.Trainer`` raises.

    :meth:`step` (or :meth:`allreduce_grads`, :meth:`update`) reduces the gradients, checks
    them once for inf/NaN (dynamic scalers: one host sync), and either skips the update (no
    weight, master, optimizer state or count changes; the scale backs off; ``skipped_steps``
    grows) or steps with ``rescale_grad = rescale_grad0 / (loss_scale * batch_size)``
    (without ``loss_scale`` after :meth:`unscale`). Masters are made on first use and again
    when a Parameter's arrays are replaced; after changing a low-precision Parameter in place,
    call :meth:`reset_master_weights`.
    """

    def __init__(self, params, optimizer, optimizer_params=None, kvstore='device',
                 compression_params=None, update_on_kvstore=None, *, loss_scaler=None,
                 target_dtype=None, grad_dtype=None, policy=None):
        kv_type = distributed.check_kvstore_args(kvstore, update_on_kvstore)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=kvstore,
                         compression_params=compression_params, update_on_kvstore=False)
        self._target_dtype, scaler = resolve_precision(self._params, policy, target_dtype,
                                                       loss_scaler)
        self._step = Step(scaler, self)
        self._masters = ParameterMasters(self._params)
        self._exchange = distributed.KVStoreExchange(len(self._params),
                                                     distributed.check_grad_dtype(
                                                         grad_dtype, kv_type,
                                                         self._step.scaler.dynamic))
        self._asked_update_on_kvstore = update_on_kvstore
        if 'dist' in (kv_type or '') and all(p._data is not None for p in self._params):
            self._prepare()   # every worker's first forward uses worker 0's weights

    target_dtype = property(lambda self: self._target_dtype,
                            doc="str: ``'float16'``, ``'bfloat16'`` or ``'float32'``.")
    loss_scaler = property(lambda self: self._step.scaler,
                           doc='mxmp.LossScaler: the current loss scaler (a new value after '
                               'every step; the group\'s when shared).')
    loss_scale = property(lambda self: float(self._step.scaler.scale),
                          doc='float: the current loss scale (1.0 when scaling is disabled).')
    skipped_steps = property(lambda self: self._step.skipped_steps,
                             doc='int: steps skipped because a gradient was inf/NaN.')

    # ------------------------------------------------------------------ gluon's hooks
    def _init_optimizer(self, optimizer, optimizer_params):
        super()._init_optimizer(optimizer, optimizer_params)
        self._updaters = [Updater(self._optimizer) for _ in self._contexts]

    def _prepare(self):
        if not self._kv_initialized:
            self._init_kvstore()
        if self._params_to_init:
            self._init_params()

    def _init_kvstore(self):
        super()._init_kvstore()
        if self._kvstore is not None and self._asked_update_on_kvstore is None:
            logger.info('mxmp.Trainer: update_on_kvstore=False on the %r kvstore (gluon\'s '
                        'default there is True): the kvstore only reduces the gradients',
                        self._kvstore.type)

    def _init_params(self):
        todo = [p for p in self._params_to_init if not p._deferred_init]
        if self._kvstore is not None and self._distributed:
            done = distributed.broadcast_initial(self._kvstore, self._params_to_init,
                                                 lambda p: self._param2idx[p.name],
                                                 self._masters)
            self._params_to_init = [p for p in self._params_to_init if p not in done]
        super()._init_params()
        for param in todo:
            for arr in param.list_data():
                arr.wait_to_read()

    def _allreduce_grads(self):
        if self._kvstore:
            self._exchange.reduce(self._kvstore, self._params, self._distributed)

    def _update(self, ignore_stale_grad=False):
        raise RuntimeError('mxmp.Trainer updates through step() or update() only: they check '
                           'the gradients for overflow and update the master weights')

    # ------------------------------------------------------------------ exchange
    def _kv(self):
        if not self._kv_initialized:
            self._init_kvstore()
        return self._kvstore

    @property
    def num_workers(self) -> int:
        """int: number of workers of the kvstore (1 without one). Creates the kvstore."""
        kv = self._kv()
        return kv.num_workers if kv else 1

    def exchange_dtype(self, param):
        """str: the dtype the gradient of ``param`` (a Parameter or its name) travels in over
        the kvstore; its own without one. ValueError if it is not this Trainer's."""
        return self._exchange.dtype(self._params[self._param_index(param)], self._kv())

    def bytes_pushed_per_step(self):
        """int: gradient bytes this worker pushes per step (elements x bytes of
        :meth:`exchange_dtype`, deferred Parameters count 0); 0 without a kvstore."""
        if not self._kv():
            return 0
        return distributed.bytes_per_step(self._params, self.exchange_dtype)

    # ------------------------------------------------------------------ the step
    @contextlib.contextmanager
    def scale_loss(self, loss):
        """Yield ``loss`` (NDArray or lists/tuples nesting them) times the loss scale.

        Use inside ``autograd.record()``, as ``mxnet.contrib.amp.scale_loss``; yields ``loss``
        itself when scaling is disabled.

        Raises:
            RuntimeError: scaling is enabled and autograd is not recording.
            TypeError: an element of ``loss`` is not an NDArray (the message says which).
        """
        if self._step.scaler.enabled and not autograd.is_recording():
            raise RuntimeError('scale_loss() must run inside autograd.record(): the multiply '
                               'by the loss scale has to be recorded for backward(). Put the '
                               '"with trainer.scale_loss(loss)" block inside the record scope.')
        yield self._step.scale_loss(loss)

    def unscale(self):
        """Divide every gradient by the loss scale in place (e.g. before clipping), as torch's
        ``GradScaler.unscale_``; the next update leaves the scale out. RuntimeError if called
        twice before the update."""
        self._step.unscale(param_grads(self._params))

    def step(self, batch_size, ignore_stale_grad=False):
        """Reduce the gradients, check them, and apply one update unless they overflowed.

        Args:
            batch_size (int or float): > 0; gradients are divided by it, as gluon.Trainer.
            ignore_stale_grad (bool): as gluon.Trainer.

        Returns:
            bool: True if the update was applied, False if it was skipped on overflow.

        Raises:
            ValueError: ``batch_size`` <= 0.
            RuntimeError: this Trainer stepped already in this iteration of its
                LossScaleGroup while other members have not; nothing is updated.
            UserWarning: (raised, as gluon.Trainer) a stale gradient.
            mxmp.LossScaleAtFloorError: the dynamic scale overflowed at its floor
                ``max_overflows_at_floor`` times in a row; nothing is updated.

        Warns:
            mxmp.NonFiniteForwardWarning: the step is skipped and the loss of
                :meth:`scale_loss` was itself inf/NaN.
        """
        _check_batch_size(batch_size)
        self._step.check_can_step()
        self._prepare()
        self._allreduce_grads()
        return self._apply_update(batch_size, ignore_stale_grad)

    def update(self, batch_size, ignore_stale_grad=False):
        """:meth:`step` without the reduction, after :meth:`allreduce_grads` (and maybe
        :meth:`unscale` and clipping); same arguments, result and errors."""
        _check_batch_size(batch_size)
        self._step.check_can_step()
        self._prepare()
        return self._apply_update(batch_size, ignore_stale_grad)

    def _collect(self, ignore_stale_grad):
        """Per device, the (index, param, data, grad) tuples to apply."""
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
            calls = [(updater, device_update(
                (i, data, grad, self._masters.of(i)[dev] if is_low_precision(param) else None)
                for i, param, data, grad in entries))
                for dev, (updater, entries) in enumerate(zip(self._updaters, per_device))]
            for entries in per_device:   # consumed whether the step is applied or skipped
                for _, _, data, _ in entries:
                    data._fresh_grad = False
            return self._step.apply(calls, self._optimizer, self._scale / batch_size,
                                    name_of=lambda i: self._params[i].name)

    # ------------------------------------------------------------------ master weights
    def master_weights(self, param):
        """The float32 master weights (one NDArray per device, the live arrays the optimizer
        updates) of a float16/bfloat16 Parameter (or its name) with a gradient.

        Raises:
            ValueError: the Parameter is not in this Trainer, or has no master weights.
        """
        i = self._param_index(param)
        p = self._params[i]
        if not is_low_precision(p):
            raise ValueError('Parameter %r has no master weights: only float16/bfloat16 '
                             'Parameters with grad_req != "null" have them (dtype %s, '
                             'grad_req %r)' % (p.name, dtype_name(p.dtype), p.grad_req))
        return self._masters.of(i)

    def reset_master_weights(self):
        """Re-create every master weight from the current Parameter values (after changing a
        low-precision Parameter in place); optimizer states are kept."""
        self._masters.clear()
        self._masters.ensure_all()

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

    # ------------------------------------------------------------------ states file
    def save_states(self, fname):
        """Write optimizer (first device, as gluon), master weights, loss scaler and
        skipped_steps to ``fname`` atomically (:func:`mxmp._src.training.checkpoint.pack_states`;
        a pickle: load only files you trust). Model parameters are not included."""
        self._prepare()
        self._masters.ensure_all()
        checkpoint.write_atomic(fname, checkpoint.pack_states({
            'params': checkpoint.param_records(self._params),
            'optimizer': self._updaters[0].get_states(dump_optimizer=True),
            'master_weights': self._masters.to_numpy(),
            'loss_scaler': self._step.scaler.state_dict(),
            'skipped_steps': self._step.skipped_steps,
            'target_dtype': self._target_dtype}))

    def load_states(self, fname, check_names=True):
        """Load what :meth:`save_states` wrote: all of it or, on any error, nothing.

        Args:
            fname (str): the file.
            check_names (bool): require the Parameter names to match (default True); False
                matches by position (count, shapes and dtypes are still checked).

        Raises:
            ValueError: not an mxmp states file, truncated, corrupt, or not matching this
                Trainer (Parameters, low-precision dtypes, loss scaler); the message says how.
            OSError: the file cannot be read.
        """
        opt_blob, masters, scaler, skipped = checkpoint.read_trainer_states(
            fname, self._params, check_names, self._step.scaler)
        self._prepare()
        for updater in self._updaters:
            updater.set_states(opt_blob)
            updater.optimizer = self._updaters[0].optimizer
        self._optimizer = self._updaters[0].optimizer
        self._optimizer.param_dict = dict(enumerate(self._params))
        self._masters.clear()
        for i, value in masters.items():
            self._masters.set_pending(i, value)
        self._masters.ensure_all()
        self._step.scaler, self._step.skipped_steps = scaler, skipped
        self._step.stage = Stage.READY


def _network_policy(params):
    """The policy of the network ``mxmp.convert`` converted the Parameters for (float16 first)."""
    from .. import gluon as hook
    found = {}
    for param in params:
        if hasattr(hook, 'policy_of'):
            policy = hook.policy_of(param)
        else:   # until gluon.policy_of is merged: the target dtype alone (delete at merge)
            dtype = hook.target_dtype_of(param)
            policy = dtype and found.get(dtype) or (Policy(dtype) if dtype else None)
        if policy is not None:
            found.setdefault(policy.target_dtype, policy)
    return next((found[d] for d in LOW_PRECISION_DTYPES if d in found), None)


def resolve_precision(params, policy, target_dtype, loss_scaler):
    """``(target dtype name, loss scaler or LossScaleGroup)`` of a Trainer (see its Args).

    Raises:
        ValueError: ``target_dtype`` or ``loss_scaler`` contradict ``policy`` (both named).
    """
    if policy is not None:
        if not isinstance(policy, Policy):
            raise TypeError('policy must be an mxmp.Policy, got %s' % type(policy).__name__)
        dtype = policy.target_dtype
        if target_dtype is not None and normalize_dtype(target_dtype, True) != dtype:
            raise ValueError('target_dtype=%r contradicts the policy\'s target dtype %r'
                             % (target_dtype, dtype))
        spec = getattr(policy, 'loss_scaler', 'auto')
        if loss_scaler is not None and spec != 'auto':
            mine = loss_scaler.current if isinstance(loss_scaler, LossScaleGroup) \
                else make_loss_scaler(loss_scaler, dtype)
            if mine != make_loss_scaler(spec, dtype):
                raise ValueError('loss_scaler=%r contradicts the policy\'s loss_scaler %r'
                                 % (loss_scaler, spec))
    else:
        names = set()
        for param in params:
            try:
                names.add(dtype_name(param.dtype))
            except TypeError:
                pass
        dtype = next((d for d in LOW_PRECISION_DTYPES if d in names), None)
        network = _network_policy(params)
        spec = getattr(network, 'loss_scaler', 'auto')
        dtype = normalize_dtype(target_dtype if target_dtype is not None else
                                dtype or getattr(network, 'target_dtype', 'float32'), True)
    if isinstance(loss_scaler, LossScaleGroup):
        return dtype, loss_scaler
    return dtype, make_loss_scaler(spec if loss_scaler is None else loss_scaler, dtype)


def _check_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, float, np.number)) \
            or not batch_size > 0:
        raise ValueError('batch_size must be a positive number, got %r' % (batch_size,))
