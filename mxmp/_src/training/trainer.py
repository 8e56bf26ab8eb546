"""mxmp.Trainer: ``gluon.Trainer`` owning a Step, the master weights of its Parameters and a
KVStoreExchange (docs/training.md)."""
import contextlib
import logging

import numpy as np
from mxnet import autograd, gluon

from .. import distributed
from ..dtypes import LOW_PRECISION_DTYPES, dtype_name, normalize_dtype
from ..gluon import install_hooks
from ..gluon_graph import policy_of
from ..policy.policy import resolve_policy
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
            float16/bfloat16 Parameters get float32 master weights, which the optimizer updates.
        kvstore (str or KVStore): as for ``gluon.Trainer`` (default ``'device'``); it only
            reduces gradients. update_on_kvstore (None or False): True is refused. With
            sparse (row_sparse) weights, as ``gluon.Trainer``, the kvstore holds the weights
            and updates them (every Parameter must then be float32, else ValueError); the
            gradients are checked for inf/NaN before they are pushed.
        loss_scaler (keyword-only): anything :func:`mxmp.make_loss_scaler` accepts, or a
            :class:`mxmp.LossScaleGroup` shared with other Trainers.
        target_dtype, policy (keyword-only): the precision; see :func:`resolve_precision`.
        grad_dtype (keyword-only, None or str): the dtype gradients travel in over the
            kvstore (:func:`mxmp._src.distributed.check_grad_dtype`).

    Raises:
        ValueError: ``update_on_kvstore=True``, an async kvstore, an unknown ``target_dtype``,
            ``loss_scaler`` or ``grad_dtype``, arguments contradicting ``policy``; plus what
            ``gluon.Trainer`` raises.
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
        grad_dtype = distributed.check_grad_dtype(grad_dtype, kv_type, self._step.scaler.dynamic)
        self._exchange = distributed.KVStoreExchange(len(self._params), grad_dtype)
        self._asked_update_on_kvstore = update_on_kvstore
        install_hooks()   # Parameter.set_data tells the masters (gluon_graph.value_changed)
        if self._contains_sparse_weight:
            _check_sparse_weights(self._params)
            # as gluon.Trainer: the kvstore holds sparse weights and updates every weight
            # (update_on_kvstore=False is refused by gluon, naming the sparse weights)
            self._kvstore_params['update_on_kvstore'] = update_on_kvstore
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
        self._kv()
        if self._params_to_init:
            self._init_params()

    def _init_kvstore(self):
        super()._init_kvstore()
        if self._kvstore is not None and self._asked_update_on_kvstore is None and \
                not self._update_on_kvstore:
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
            for arr in param._check_and_get(param._data, list):   # sparse weights too
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

    def _reduction(self):
        """``(kv_type, pushes)``: the reduction the gradients travel over (the kvstore's type,
        None without one) and whether this worker pushes gradients into it."""
        kv = self._kv()
        return (kv.type, True) if kv else (None, False)

    def exchange_dtype(self, param):
        """str: the dtype the gradient of ``param`` (a Parameter or its name) travels in over
        the kvstore; its own without one. ValueError if it is not this Trainer's."""
        return self._exchange.dtype(self._params[self._param_index(param)], self._reduction()[0])

    def bytes_pushed_per_step(self):
        """int: gradient bytes this worker pushes per step (elements x bytes of
        :meth:`exchange_dtype`, deferred Parameters count 0); 0 without a kvstore."""
        if not self._reduction()[1]:
            return 0
        return distributed.bytes_per_step(self._params, self.exchange_dtype)

    # ------------------------------------------------------------------ the step
    @contextlib.contextmanager
    def scale_loss(self, loss):
        """Yield ``loss`` (NDArray or lists/tuples nesting them) times the loss scale, inside
        ``autograd.record()`` (else RuntimeError); TypeError naming a non-NDArray element."""
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
        """Reduce the gradients, check them once for inf/NaN (dynamic scalers: one host sync)
        and skip the update (nothing changes but the scale and ``skipped_steps``; returns
        False) or step with ``rescale_grad = rescale_grad0 / (loss_scale * batch_size)``.
        ``batch_size`` (> 0, else ValueError) and ``ignore_stale_grad`` as gluon.Trainer.

        Raises:
            RuntimeError: this Trainer stepped already in this iteration of its LossScaleGroup.
            UserWarning: (raised, as gluon.Trainer) a stale gradient.
            mxmp.LossScaleAtFloorError: see :meth:`mxmp._src.training.step.Step.apply`.

        Warns:
            mxmp.NonFiniteForwardWarning: skipped, and the loss itself was inf/NaN.
        """
        return self._apply_update(batch_size, ignore_stale_grad, reduce=True)

    def update(self, batch_size, ignore_stale_grad=False):
        """:meth:`step` without the reduction, after :meth:`allreduce_grads` (and maybe
        :meth:`unscale` and clipping); same arguments, result and errors."""
        return self._apply_update(batch_size, ignore_stale_grad)

    def _apply_update(self, batch_size, ignore_stale_grad, reduce=False):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, float, np.number)) \
                or not batch_size > 0:
            raise ValueError('batch_size must be a positive number, got %r' % (batch_size,))
        self._step.group.check_can_step(self, _describe)
        install_hooks()   # again after a remove_hooks(): the masters follow set_data
        self._prepare()
        if self._update_on_kvstore:
            return self._apply_on_kvstore(batch_size, ignore_stale_grad)
        if reduce:
            self._allreduce_grads()
        with autograd.pause():
            per_device = [[] for _ in self._updaters]   # (index, weight, grad, master or None)
            for i, param in enumerate(self._params):
                if param.grad_req == 'null':
                    continue
                for dev, (data, grad) in enumerate(zip(param.list_data(), param.list_grad())):
                    if not data._fresh_grad and not ignore_stale_grad:
                        raise UserWarning(
                            'Gradient of Parameter `%s` on context %s has not been updated by '
                            'backward since the last step. If only a subset of the Parameters '
                            'is used on purpose, call step with ignore_stale_grad=True to skip '
                            'the Parameters with stale gradients.' % (param.name, data.context))
                    if data._fresh_grad:
                        per_device[dev].append((i, data, grad, self._masters.of(i)[dev]
                                                if is_low_precision(param) else None))
            for entries in per_device:   # consumed whether the step is applied or skipped
                for _, data, _, _ in entries:
                    data._fresh_grad = False
            calls = [(u, device_update(e)) for u, e in zip(self._updaters, per_device)]
            return self._step.apply(calls, self._optimizer, self._scale / batch_size,
                                    name_of=lambda i: self._params[i].name)

    def _apply_on_kvstore(self, batch_size, ignore_stale_grad):
        """The step of a Trainer with sparse weights, as gluon.Trainer's: the kvstore applies
        the optimizer while the gradients are pushed, so every gradient is checked for
        inf/NaN first (the push is skipped on overflow); stale gradients raise as in gluon
        (the push covers every Parameter whose grad_req is not 'null', as gluon's)."""
        _check_sparse_weights(self._params)   # again: a frozen float16 one may be trainable now
        with autograd.pause():
            for param in self._params:
                if param.grad_req == 'null' or ignore_stale_grad:
                    continue
                for data in param._check_and_get(param._data, list):
                    if not data._fresh_grad:
                        raise UserWarning(
                            'Gradient of Parameter `%s` on context %s has not been updated '
                            'by backward since the last step. If only a subset of the '
                            'Parameters is used on purpose, call step with '
                            'ignore_stale_grad=True.' % (param.name, data.context))
            per_device = [list(g) for g in zip(*[p.list_grad() for p in self._params
                                                  if p.grad_req != 'null'])]
            return self._step.apply([], self._optimizer, self._scale / batch_size,
                                    name_of=lambda i: self._params[i].name,
                                    on_kvstore=(per_device,
                                                lambda: gluon.Trainer._allreduce_grads(self)))

    def _optimizer_updater(self):
        """The Updater holding the optimizer states: the kvstore's when it updates."""
        if self._update_on_kvstore:
            return self._kvstore._updater
        return self._updaters[0]

    # ------------------------------------------------------------------ master weights
    def master_weights(self, param):
        """The float32 master weights (one per device, the live arrays the optimizer updates)
        of a low-precision Parameter (or its name); ValueError if it has none here."""
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
        skipped_steps to ``fname`` atomically (a checksummed pickle: load only files you
        trust). Model parameters are not included."""
        self._prepare()
        self._masters.ensure_all()
        checkpoint.write_trainer_states(fname, self._params, {
            'optimizer': self._optimizer_updater().get_states(dump_optimizer=True),
            'master_weights': self._masters.to_numpy(),
            'loss_scaler': self._step.scaler.state_dict(),
            'skipped_steps': self._step.skipped_steps,
            'target_dtype': self._target_dtype})

    def load_states(self, fname, check_names=True):
        """Load what :meth:`save_states` wrote: all of it or, on any error, nothing.
        ``check_names=False`` matches Parameters by position. ValueError (the message says
        why) if the file is not such a file, is damaged or does not match this Trainer."""
        opt_blob, masters, scaler, skipped = checkpoint.read_trainer_states(
            fname, self._params, check_names, self._step.scaler)
        self._prepare()
        if self._update_on_kvstore:
            self._kvstore._updater.set_states(opt_blob)
            self._optimizer = self._kvstore._updater.optimizer
        else:
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


def _check_sparse_weights(params):
    """ValueError unless every Parameter is float32 when some weights are sparse: gluon (and
    so mxmp) updates them on the kvstore, which holds the weights, where mxmp cannot keep
    float32 master weights or skip the update of one overflowing step of low precision."""
    low = [p.name for p in params if is_low_precision(p)]
    if low:
        sparse = [p.name for p in params if p._stype != 'default']
        raise ValueError(
            'this Trainer has sparse (row_sparse) weights (%s), which gluon updates on the '
            'kvstore, and float16/bfloat16 Parameters (%s), whose float32 master weights the '
            'kvstore cannot keep. Give the sparse weights a Trainer of their own, or keep '
            'these Parameters float32.' % (', '.join(sparse[:3]), ', '.join(low[:3])))


def _describe(member):
    """A member of a Trainer's LossScaleGroup, as the group's error names it."""
    params = getattr(member, '_params', None) or []   # a Module's Step has none
    first = params[0].name if params else 'no parameters'
    return 'Trainer of %d parameter(s) starting with %s' % (len(params), first)


def resolve_precision(params, policy, target_dtype, loss_scaler):
    """``(target dtype name, loss scaler or LossScaleGroup)`` of a Trainer over ``params``.

    The target dtype: ``policy``'s; else ``target_dtype``; else float16 if a Parameter is
    float16, bfloat16 if one is; else that of the network ``mxmp.convert`` converted the
    Parameters for; else float32. ``loss_scaler`` defaults to the policy's (else 'auto').
    The errors of :func:`mxmp._src.policy.policy.resolve_policy` (``policy``, ``target_dtype``);
    ValueError if ``loss_scaler`` contradicts ``policy`` (both named).
    """
    if policy is not None:
        policy = resolve_policy(policy, target_dtype)
        dtype, spec = policy.target_dtype, policy.loss_scaler
        if loss_scaler is not None and spec != 'auto':
            mine = loss_scaler.current if isinstance(loss_scaler, LossScaleGroup) \
                else make_loss_scaler(loss_scaler, dtype)
            if mine != make_loss_scaler(spec, dtype):
                raise ValueError('loss_scaler=%r contradicts the policy\'s loss_scaler %r'
                                 % (loss_scaler, spec))
    else:
        names, policies = set(), {}   # the Parameters' dtypes; their network's policies
        for param in params:
            found = policy_of(param)
            if found is not None:
                policies.setdefault(found.target_dtype, found)
            try:
                names.add(dtype_name(param.dtype))
            except TypeError:
                pass
        dtype = next((d for d in LOW_PRECISION_DTYPES if d in names), None)
        network = next((policies[d] for d in LOW_PRECISION_DTYPES if d in policies), None)
        spec = network.loss_scaler if network is not None else 'auto'
        dtype = normalize_dtype(target_dtype if target_dtype is not None else
                                dtype or getattr(network, 'target_dtype', 'float32'), True)
    if isinstance(loss_scaler, LossScaleGroup):
        return dtype, loss_scaler
    return dtype, make_loss_scaler(spec if loss_scaler is None else loss_scaler, dtype)

