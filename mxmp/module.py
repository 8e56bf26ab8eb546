"""Mixed-precision Symbolic Module: ``mx.mod.Module`` with mxmp's pass and dynamic loss scaling.

:class:`Module` is ``mx.mod.Module`` (MXNet 1.9.1, ``python/mxnet/module/module.py``) whose
symbol goes through :func:`mxmp.convert_symbol`, with the three pieces of mixed-precision
training (Micikevicius et al., "Mixed Precision Training", ICLR 2018; NVIDIA, "Training With
Mixed Precision" guide) that ``mxnet.contrib.amp`` gives Module users only in part (a static
loss scale through ``SoftmaxOutput(grad_scale=...)``):

1. **dynamic loss scaling without rebinding**: a *loss-scale node* sits in front of the loss
   outputs. It is an identity in the forward pass and multiplies the backward signal by the
   loss scale ``S``, which lives in an input array of the executors (the state
   ``__mxmp_loss_scale__``) that :meth:`Module.update` rewrites when ``S`` changes;
2. **overflow check**: after the kvstore has reduced the gradients, every gradient on every
   context is checked for inf/NaN; on overflow the update is skipped (weights, master
   weights and optimizer state stay bit-identical) and ``S`` backs off; otherwise the
   optimizer steps with ``rescale_grad = rescale_grad0 / S`` where ``rescale_grad0`` is what
   ``Module.init_optimizer`` sets (``1/batch_size``, times ``num_workers`` for dist_sync);
3. **float32 master weights** when ``cast_params=True``: as in :class:`mxmp.Trainer`; the
   shared code is :mod:`mxmp.update`.

The loss-scale node, for a loss op ``L`` whose data input is ``x`` (float32: the pass keeps
loss ops in float32)::

    b = BlockGrad(x)
    y = b + (x - b) * S            # L(y, label) instead of L(x, label)

Forward: ``x - b`` is exactly 0 for every finite ``x``, ``0 * S`` is 0 and ``b + 0`` is ``x``:
``y`` is bit-identical to ``x`` (the only difference: ``-0.0`` becomes ``+0.0``, and inf/NaN
become NaN, which the overflow check catches anyway). Backward: the gradient reaching ``x`` is
the loss op's gradient times ``S`` through one multiply (``BlockGrad`` passes nothing), exact
for a power-of-two ``S`` unless it overflows, which is the point of the check.

Which loss ops get the node: every op of the policy's ``LOSS_OUTPUT`` class (plus
``SoftmaxOutput``, ``LinearRegressionOutput``, ``LogisticRegressionOutput``,
``MAERegressionOutput``, ``MakeLoss`` in any case) that makes its own gradient, i.e. ignores
the gradient of its output. The loss ops that propagate their output's gradient
(:data:`HEAD_GRADIENT_LOSS_OPS`: ``softmax_cross_entropy``, the CTC losses) get their scaled
gradient from downstream: from a ``MakeLoss`` that consumes them, or, at a graph output, from
``out_grads`` passed to :meth:`Module.backward`, which the Module multiplies by ``S``. So every
gradient is scaled exactly once.

Checkpoints: :meth:`Module.save_checkpoint` writes the float32 symbol (no casts, no loss-scale
node) and float32 parameters (the master weights) that plain MXNet loads, plus
``prefix-%04d.mxmp.json`` with the loss scaler and skipped steps; :meth:`Module.load` restores
all of it, and loads plain-MXNet checkpoints too.
"""
import json
import logging
import os

import mxnet as mx
import numpy as np
from mxnet import nd

from .device import lp_kernels_available
from .errors import mxnet_error_line
from .graph import convert_symbol, remove_casts
from .graph.loss_heads import (HEAD_GRADIENT_LOSS_OPS, LOSS_SCALE_NAME,  # noqa: F401
                               insert_loss_scale, lp_variable_names, scaled_loss_ops)
from .policy import Policy, normalize_dtype
from .scaler import (DynamicLossScaler, LossScaler, NoOpLossScaler, StaticLossScaler,
                     make_loss_scaler)
from .update import (MasterWeights, all_finite, apply_update, device_update,
                     is_low_precision, save_atomic, write_atomic)

__all__ = ['Module', 'insert_loss_scale', 'LOSS_SCALE_NAME',
           'HEAD_GRADIENT_LOSS_OPS']

_STATES_FORMAT = 'mxmp.Module'
_STATES_VERSION = 1
_SCALER_CLASSES = {c.__name__: c for c in (NoOpLossScaler, StaticLossScaler, DynamicLossScaler)}


class _TrainState:
    """What the Modules of one model share (all buckets of a BucketingModule)."""

    def __init__(self, scaler):
        self.scaler = scaler
        self.skipped_steps = 0
        self.masters = MasterWeights()   # parameter name -> float32 per context
        self.rescale_grad = None         # rescale_grad0: set by init_optimizer


# ---------------------------------------------------------------------------------------------
# Module
# ---------------------------------------------------------------------------------------------
class Module(mx.mod.Module):
    """``mx.mod.Module`` training in mixed precision with dynamic loss scaling.

    Args:
        symbol (mx.sym.Symbol): the float32 network with its loss output(s), as for
            ``mx.mod.Module`` (a graph already converted by mxmp is accepted: its casts are
            stripped first).
        data_names, label_names (sequence of str): as for ``mx.mod.Module``; default
            ``('data',)`` and ``('softmax_label',)``.
        target_dtype (str): ``'bfloat16'`` (default; CPUs with oneDNN), ``'float16'`` (NVIDIA
            GPUs) or ``'float32'`` (no conversion: plain float32 training, with loss scaling
            if asked). Ignored when ``policy`` is given.
        loss_scaler: anything :func:`mxmp.scaler.make_loss_scaler` accepts: None/'auto'
            (default: dynamic for float16, none for bfloat16/float32, since bfloat16 has
            float32's exponent range), 'dynamic', 'static', 'none', a number (static scale)
            or a :class:`mxmp.scaler.LossScaler`.
        cast_params (bool): store the weights of low-precision layers in the target dtype on
            the contexts (no cast per iteration) and keep float32 master weights for them
            (:mod:`mxmp.update`); default False (float32 weights, one in-graph cast each).
            ``get_params`` and checkpoints always hold the float32 master weights.
        emulate (bool): float32 kernels with low-precision rounding (``mxmp.graph``), for
            machines without low-precision kernels (``mxmp.lp_kernels_available``); default
            False.
        policy (mxmp.Policy or None): op classes and overrides; default
            ``Policy(target_dtype, emulate=emulate)``.
        state_names, logger, context, work_load_list, fixed_param_names, group2ctxs,
            compression_params: as for ``mx.mod.Module`` (keyword-only here).

    Raises:
        ValueError: unknown ``target_dtype`` or ``loss_scaler``; a symbol that already holds
            the loss-scale input.
        RuntimeError: a context has no kernels for the target dtype and ``emulate`` is False
            (the message names the fix).

    Differences from ``mx.mod.Module`` (MXNet 1.9.1):

    * :attr:`symbol` is the float32 graph (what callbacks such as ``mx.callback.do_checkpoint``
      save); the bound graph, casts and loss-scale node included, is :attr:`mxmp_symbol`;
    * the optimizer always runs in the Module (``update_on_kvstore`` is False, logged at INFO;
      a kvstore only reduces the gradients, in float32), so asynchronous kvstores are refused;
      every worker checks the same reduced gradients, so all skip the same steps; on a dist
      kvstore :meth:`init_optimizer` gives every worker worker 0's parameters;
    * :meth:`update` returns whether the step was applied (False: skipped on overflow);
    * :meth:`backward` multiplies user ``out_grads`` by the loss scale, and
      :meth:`get_input_grads` divides input gradients by it, so both are in the user's units;
    * :meth:`get_states` / :meth:`set_states` leave the loss-scale state out.

    Costs per step with a dynamic scaler: one overflow check (one ``multi_all_finite`` per 200
    gradients per context) and one host synchronisation; with ``cast_params`` a float32
    gradient copy per low-precision weight and context. The loss-scale node adds three
    elementwise ops on the loss inputs (e.g. the logits).

    BucketingModule: see :class:`mxmp.bucketing.BucketingModule`.
    """

    def __init__(self, symbol, data_names=('data',), label_names=('softmax_label',), *,
                 target_dtype='bfloat16', loss_scaler=None, cast_params=False, emulate=False,
                 policy=None, state_names=None, logger=logging, context=None, **module_kwargs):
        if not isinstance(symbol, mx.sym.Symbol):
            raise TypeError('mxmp.Module needs an mx.sym.Symbol, got %s; for a Gluon block use '
                            'mxmp.convert(block) and mxmp.Trainer' % type(symbol).__name__)
        if LOSS_SCALE_NAME in symbol.list_arguments():
            raise ValueError('the symbol already holds the loss-scale input %r: pass the '
                             'float32 graph (module.symbol), not module.mxmp_symbol'
                             % LOSS_SCALE_NAME)
        if policy is not None:
            if not isinstance(policy, Policy):
                raise TypeError('policy must be an mxmp.Policy, got %s' % type(policy).__name__)
            if emulate and not policy.emulate:
                policy = policy.replace(emulate=True)
            target = policy.target_dtype
        else:
            target = normalize_dtype(target_dtype, allow_float32=True)
            policy = None if target == 'float32' else Policy(target, emulate=emulate)
        self._target_dtype = target
        self._policy = policy
        self._cast_params = bool(cast_params) and policy is not None
        context = mx.cpu() if context is None else context
        contexts = [context] if isinstance(context, mx.Context) else list(context)
        if policy is not None and not policy.emulate:
            for ctx in contexts:
                if not lp_kernels_available(target, ctx):
                    raise RuntimeError(
                        '%s has no %s kernels (oneDNN needs AVX-512 for bfloat16; CPUs have no '
                        'float16 GEMM). Pass emulate=True to run the same numerics with '
                        'float32 kernels, or target_dtype="float32".' % (ctx, target))

        self._fp32_symbol = remove_casts(symbol)
        data_names = list(data_names) if data_names is not None else []
        label_names = list(label_names) if label_names is not None else []
        state_names = list(state_names) if state_names is not None else []
        if policy is None:
            mp_symbol = self._fp32_symbol
        else:
            mp_symbol = convert_symbol(self._fp32_symbol, policy=policy,
                                       cast_params=self._cast_params,
                                       data_names=data_names + label_names + state_names)
            # convert_symbol pins every parameter's dtype (__dtype__): behind a cast the
            # executors could not infer it.
        self._mp_symbol = mp_symbol
        self._lp_names = lp_variable_names(mp_symbol) if self._cast_params else frozenset()
        self._state = _TrainState(make_loss_scaler(loss_scaler, target))
        self._scale_nodes = 0
        bound = mp_symbol
        if self._state.scaler.enabled:
            bound, self._scale_nodes = insert_loss_scale(mp_symbol, scaled_loss_ops(policy))
            if self._scale_nodes:
                state_names = state_names + [LOSS_SCALE_NAME]
        self._written_scale = None
        super().__init__(bound, data_names, label_names, logger=logger, context=context,
                         state_names=state_names, **module_kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def symbol(self):
        """mx.sym.Symbol: the float32 network (no casts, no loss-scale node)."""
        return self._fp32_symbol

    @property
    def mxmp_symbol(self):
        """mx.sym.Symbol: the graph the executors run (casts and loss-scale node)."""
        return self._symbol

    @property
    def target_dtype(self):
        """str: ``'float16'``, ``'bfloat16'`` or ``'float32'``."""
        return self._target_dtype

    @property
    def policy(self):
        """mxmp.Policy or None (float32): the policy of the pass."""
        return self._policy

    @property
    def cast_params(self):
        """bool: whether low-precision weights are stored in the target dtype."""
        return self._cast_params

    @property
    def loss_scaler(self) -> LossScaler:
        """LossScaler: the current loss scaler (a new value after every update)."""
        return self._state.scaler

    @property
    def loss_scale(self) -> float:
        """float: the current loss scale ``S`` (1.0 when scaling is disabled)."""
        return float(self._state.scaler.scale)

    @property
    def skipped_steps(self) -> int:
        """int: number of updates skipped because a gradient was inf/NaN."""
        return self._state.skipped_steps

    @property
    def loss_scale_nodes(self) -> int:
        """int: number of loss-scale nodes in the bound graph (0 when scaling is disabled)."""
        return self._scale_nodes

    def master_weights(self, name):
        """The float32 master weights of a low-precision parameter (``cast_params=True``).

        Args:
            name (str): parameter name.

        Returns:
            list of NDArray: float32, one per context, the live arrays the optimizer updates.

        Raises:
            ValueError: ``name`` is not stored in low precision, or parameters are not
                initialized yet.
        """
        if name not in self._lp_names:
            raise ValueError('parameter %r has no master weights: only the parameters stored '
                             'in the target dtype (cast_params=True) have them: %s'
                             % (name, sorted(self._lp_names)))
        if not (self.binded and self.params_initialized):
            raise ValueError('bind and initialize the Module before asking for master weights')
        return self._state.masters.get(name, self._device_arrays(name), track=False)

    # ------------------------------------------------------------------ helpers
    def _device_arrays(self, name):
        group = self._exec_group
        return group.param_arrays[group.param_names.index(name)]

    def _write_loss_scale(self):
        """Write the current loss scale into every executor's input (when it changed)."""
        if not self._scale_nodes or not self.binded:
            return
        arrays = [e.arg_dict[LOSS_SCALE_NAME] for e in self._exec_group.execs]
        scale = float(self._state.scaler.scale)
        if self._written_scale is not None:
            old_arrays, old_scale = self._written_scale
            if old_scale == scale and len(old_arrays) == len(arrays) and \
                    all(a is b for a, b in zip(old_arrays, arrays)):
                return
        for arr in arrays:
            arr[:] = scale
        self._written_scale = (arrays, scale)

    def _params_written(self, values):
        """The device parameters were just written from ``values``: new master weights."""
        if not self._lp_names or values is None:
            return
        masters = self._state.masters
        for name in self._lp_names:
            if name in values and name in self._exec_group.param_names:
                masters.set_pending(name, values[name])
                masters.get(name, self._device_arrays(name), track=False)

    # ------------------------------------------------------------------ Module API
    def bind(self, data_shapes, label_shapes=None, for_training=True, inputs_need_grad=False,
             force_rebind=False, shared_module=None, grad_req='write'):
        """Bind the executors, as ``mx.mod.Module.bind``.

        On a re-bind the current (float32 master) parameters are carried over. With
        ``shared_module`` (bucketing) the loss scaler, skipped steps and master weights are
        shared with it. Arguments as ``mx.mod.Module.bind``.
        """
        if self.binded and not force_rebind:
            return super().bind(data_shapes, label_shapes, for_training, inputs_need_grad,
                                force_rebind, shared_module, grad_req)
        if self.binded and self.params_initialized and self._params_dirty:
            self._sync_params_from_devices()
        if shared_module is not None and not isinstance(shared_module, Module):
            raise ValueError('an mxmp.Module can share memory only with another mxmp.Module '
                             '(got %s)' % type(shared_module).__name__)
        fresh = self._arg_params is None
        super().bind(data_shapes, label_shapes, for_training, inputs_need_grad, force_rebind,
                     shared_module, grad_req)
        if shared_module is not None:
            self._state = shared_module._state
        elif fresh and not self.params_initialized:
            # The host copies hold the float32 values (initializers cannot fill bfloat16).
            for name in self._lp_names:
                arr = self._arg_params[name]
                self._arg_params[name] = nd.zeros(arr.shape, dtype='float32')
        elif self.params_initialized:
            self._params_written(self._arg_params)
        self._written_scale = None
        self._write_loss_scale()
        return None

    def reshape(self, data_shapes, label_shapes=None):
        """Reshape the executors, as ``mx.mod.Module.reshape`` (the loss scale is kept)."""
        super().reshape(data_shapes, label_shapes)
        self._write_loss_scale()

    def init_params(self, initializer=mx.init.Uniform(0.01), arg_params=None, aux_params=None,
                    allow_missing=False, force_init=False, allow_extra=False):
        """Initialize parameters, as ``mx.mod.Module.init_params``; master weights follow."""
        if self.params_initialized and not force_init:
            return super().init_params(initializer, arg_params, aux_params, allow_missing,
                                       force_init, allow_extra)
        super().init_params(initializer, arg_params, aux_params, allow_missing, force_init,
                            allow_extra)
        self._params_written(self._arg_params)
        return None

    def set_params(self, arg_params, aux_params, allow_missing=False, force_init=True,
                   allow_extra=False):
        """Assign parameters, as ``mx.mod.Module.set_params``; master weights follow.

        Give float32 values: a low-precision parameter's master weight is the given value.
        """
        ignored = self.params_initialized and not force_init
        super().set_params(arg_params, aux_params, allow_missing, force_init, allow_extra)
        if allow_missing and not ignored:
            self._params_written(arg_params)

    def _sync_params_from_devices(self):
        # BatchNorm writes its moving mean/var in the backward pass on CPU, outside the
        # engine's dependency tracking of the aux arrays: without a wait the copy can read
        # the statistics of the previous step (seen as a resumed run off by one update).
        nd.waitall()
        super()._sync_params_from_devices()
        for name in self._lp_names:
            master = self._state.masters.first_device(name)
            if isinstance(master, nd.NDArray):
                master.copyto(self._arg_params[name])

    def init_optimizer(self, kvstore='local', optimizer='sgd',
                       optimizer_params=(('learning_rate', 0.01),), force_init=False):
        """Install the optimizer, as ``mx.mod.Module.init_optimizer``, updating in the Module.

        As MXNet does, ``rescale_grad`` defaults to ``1/batch_size`` (``batch_size`` times
        the number of workers for ``dist_sync``); each update divides it by the loss scale.
        Unlike MXNet the optimizer never runs on the kvstore (``update_on_kvstore`` False:
        mxmp must see the reduced gradients to check them); the kvstore reduces float32
        gradients only.

        Args:
            kvstore (str, KVStore or None): default ``'local'`` (no kvstore with one context).
            optimizer (str or mx.optimizer.Optimizer): default ``'sgd'``.
            optimizer_params (dict or sequence of pairs): default learning_rate 0.01.
            force_init (bool): re-create an installed optimizer.

        Raises:
            ValueError: an asynchronous kvstore (it needs the update on the kvstore).
            TypeError: ``optimizer`` is neither a name nor an Optimizer.
        """
        assert self.binded and self.params_initialized, \
            'call bind and init_params before init_optimizer'
        if self.optimizer_initialized and not force_init:
            self.logger.warning('optimizer already initialized, ignoring...')
            return
        kv_type = kvstore if isinstance(kvstore, str) else getattr(kvstore, 'type', '')
        if 'async' in (kv_type or ''):
            raise ValueError('mxmp.Module does not support the asynchronous kvstore %r: it '
                             'updates on the kvstore, where overflow cannot be checked. Use '
                             "'local', 'device' or 'dist_sync'." % (kv_type,))
        if self._params_dirty:
            self._sync_params_from_devices()
        kv, _ = mx.model._create_kvstore(kvstore, len(self._context), self._arg_params)
        batch_size = self._exec_group.batch_size
        if kv and 'dist' in kv.type and '_sync' in kv.type:
            batch_size *= kv.num_workers
        ndev = len(self._context)
        # One optimizer index per parameter and context, as MXNet's update without kvstore.
        idx2name = {i * ndev + k: name
                    for i, name in enumerate(self._exec_group.param_names)
                    for k in range(ndev)}
        if isinstance(optimizer, str):
            params = dict(optimizer_params)
            params.setdefault('rescale_grad', 1.0 / batch_size)
            optimizer = mx.optimizer.create(optimizer, sym=self.symbol,
                                            param_idx2name=idx2name, **params)
        elif isinstance(optimizer, mx.optimizer.Optimizer):
            if optimizer.rescale_grad != 1.0 / batch_size:
                self.logger.warning('the optimizer\'s rescale_grad is %s, not 1/batch_size = '
                                    '%s; mxmp divides it by the loss scale at every step',
                                    optimizer.rescale_grad, 1.0 / batch_size)
            if not optimizer.idx2name:
                optimizer.idx2name = dict(idx2name)
        else:
            raise TypeError('optimizer must be a name or an mx.optimizer.Optimizer, got %s'
                            % type(optimizer).__name__)
        self._state.rescale_grad = optimizer.rescale_grad
        self._optimizer = optimizer
        self._kvstore = kv
        self._update_on_kvstore = False
        if kv:
            self.logger.info('mxmp.Module: update_on_kvstore=False on the %r kvstore: it only '
                             'reduces the gradients; every worker checks them for overflow and '
                             'updates its own weights', kv.type)
            if self._compression_params:
                kv.set_gradient_compression(self._compression_params)
            for name in self._exec_group.param_names:
                kv.init(name, self._arg_params[name])
            if 'dist' in kv.type:
                # kv.init stored worker 0's float32 values; MXNet's Module without
                # update_on_kvstore would keep each worker's own. Start every worker from
                # worker 0's, and wait for the pulls before any gradient is pushed on the same
                # keys (the server's value of a key becomes the gradient sum after a round).
                pulled = {name: self._arg_params[name].copy()
                          for name in self._exec_group.param_names}
                for name, value in pulled.items():
                    kv.pull(name, out=value)
                for value in pulled.values():
                    value.wait_to_read()
                self.set_params(dict(self._arg_params, **pulled), self._aux_params,
                                force_init=True)
        self._updater = mx.optimizer.get_updater(optimizer)
        self.optimizer_initialized = True
        if self._preload_opt_states is not None:
            self.load_optimizer_states(self._preload_opt_states)
            self._preload_opt_states = None

    def borrow_optimizer(self, shared_module):
        """Share the optimizer, loss scaler and master weights of another mxmp.Module."""
        if not isinstance(shared_module, Module):
            raise ValueError('an mxmp.Module can borrow the optimizer only from another '
                             'mxmp.Module (got %s)' % type(shared_module).__name__)
        super().borrow_optimizer(shared_module)
        self._state = shared_module._state

    def forward(self, data_batch, is_train=None):
        """Forward, as ``mx.mod.Module.forward`` (outputs bit-identical to no loss scaling)."""
        self._write_loss_scale()
        super().forward(data_batch, is_train)

    def backward(self, out_grads=None):
        """Backward with the loss scale applied.

        Args:
            out_grads (NDArray or list of NDArray or None): gradients of outputs that are not
                loss ops, in the user's units; they are multiplied by the loss scale here
                (a power of two: exact).
        """
        self._write_loss_scale()
        if out_grads is not None and self._state.scaler.enabled:
            scale = float(self._state.scaler.scale)
            if isinstance(out_grads, nd.NDArray):
                out_grads = [out_grads]
            out_grads = [g * scale for g in out_grads]
        super().backward(out_grads)

    def get_input_grads(self, merge_multi_context=True):
        """Input gradients, as ``mx.mod.Module.get_input_grads``, divided by the loss scale."""
        grads = super().get_input_grads(merge_multi_context)
        if not self._state.scaler.enabled:
            return grads
        scale = float(self._state.scaler.scale)
        if merge_multi_context:
            return [g / scale for g in grads]
        return [[g / scale for g in per_ctx] for per_ctx in grads]

    def get_states(self, merge_multi_context=True):
        """States, as ``mx.mod.Module.get_states``, without the loss-scale input."""
        states = super().get_states(merge_multi_context)
        return states[:-1] if self._scale_nodes else states

    def set_states(self, states=None, value=None):
        """Set states, as ``mx.mod.Module.set_states``; the loss-scale input is kept."""
        super().set_states(states, value)
        self._written_scale = None
        self._write_loss_scale()

    def update(self):
        """Reduce the gradients, check them for overflow, and update or skip.

        After ``forward``/``backward`` (``Module.fit`` calls it for every batch). Gradients
        are reduced across contexts (and workers) by the kvstore, in float32; then one
        overflow check covers every gradient on every context (dynamic loss scaler only);
        on overflow nothing changes but the loss scale (backed off) and :attr:`skipped_steps`;
        otherwise the optimizer steps with ``rescale_grad = rescale_grad0 / loss_scale``,
        updating master weights for low-precision parameters and writing them back.

        Returns:
            bool: True if the update was applied, False if it was skipped on overflow.

        Raises:
            mxmp.update.LossScaleAtFloorError: the loss scale stayed at its floor for
                ``max_overflows_at_floor`` consecutive overflows (the message names the
                parameters whose gradients were inf/NaN); nothing is updated.

        Warns:
            mxmp.update.NonFiniteForwardWarning: the update is skipped and the outputs of
                the forward pass were themselves inf/NaN (not an overflow from scaling).
        """
        assert self.binded and self.params_initialized and self.optimizer_initialized
        self._params_dirty = True
        group = self._exec_group
        ndev = len(self._context)
        kv = self._kvstore
        per_ctx = [[] for _ in range(ndev)]
        for i, (name, weights, grads) in enumerate(zip(group.param_names, group.param_arrays,
                                                       group.grad_arrays)):
            if grads[0] is None:
                continue
            low = name in self._lp_names and is_low_precision(weights[0].dtype)
            if low:
                grads = [nd.amp_cast(g, dtype='float32') for g in grads]
            if kv:
                if grads[0].stype == 'default' and weights[0].stype == 'default':
                    kv.pushpull(name, grads, priority=-i)
                else:
                    kv.push(name, grads, priority=-i)
                    kv.pull(name, out=grads, priority=-i)
            masters = (self._state.masters.get(name, weights, track=False) if low
                       else [None] * ndev)
            for k in range(ndev):
                per_ctx[k].append((i * ndev + k, weights[k], grads[k], masters[k]))
        calls = [(self._updater, device_update(entries)) for entries in per_ctx]
        applied, self._state.scaler = apply_update(
            calls, self._optimizer, self._state.scaler, self._state.rescale_grad,
            name_of=lambda idx: group.param_names[idx // ndev],
            forward_finite=lambda: all_finite(group.get_outputs(merge_multi_context=False)))
        if not applied:
            self._state.skipped_steps += 1
        self._write_loss_scale()
        return applied

    # ------------------------------------------------------------------ checkpoints
    def save_optimizer_states(self, fname):
        """Save the optimizer and its states (atomically), in a format plain MXNet reads.

        The file is ``Updater.get_states(dump_optimizer=True)``: the states (for a
        low-precision parameter, those of its float32 master weight) and the optimizer itself,
        so that its update counts, hence the learning-rate schedule's position, survive a
        resume even when overflow skipped some steps. ``mx.mod.Module.load_optimizer_states``
        reads it too. The master weights are the float32 parameters (``get_params``,
        ``save_params``, ``save_checkpoint``), not part of this file.
        """
        assert self.optimizer_initialized
        write_atomic(fname, self._updater.get_states(dump_optimizer=True))

    def load_optimizer_states(self, fname):
        """Load what :meth:`save_optimizer_states` (or plain MXNet's) wrote.

        A file holding the optimizer replaces the installed one (update counts and schedule
        included); ``rescale_grad`` stays ``1/batch_size`` of this Module.
        """
        assert self.optimizer_initialized
        with open(fname, 'rb') as fin:
            self._updater.set_states(fin.read())
        self._optimizer = self._updater.optimizer

    def mixed_precision_state(self):
        """dict: what ``prefix-%04d.mxmp.json`` holds (JSON-serialisable)."""
        return {'format': _STATES_FORMAT, 'version': _STATES_VERSION,
                'target_dtype': self._target_dtype, 'cast_params': self._cast_params,
                'emulate': bool(self._policy is not None and self._policy.emulate),
                'loss_scaler': self._state.scaler.state_dict(),
                'skipped_steps': self._state.skipped_steps}

    def save_checkpoint(self, prefix, epoch, save_optimizer_states=False, remove_amp_cast=True):
        """Save a checkpoint that plain MXNet loads, plus the loss-scaling state.

        Files: ``prefix-symbol.json`` (the float32 symbol: no casts, no loss-scale node; with
        ``remove_amp_cast=False`` the mixed-precision graph with its casts, still without
        the loss-scale node), ``prefix-%04d.params`` (float32: the master weights when
        ``cast_params``), optionally ``prefix-%04d.states`` (MXNet's optimizer-state
        format), and ``prefix-%04d.mxmp.json`` (loss scaler state and configuration,
        skipped steps, target dtype), each written atomically.

        Args:
            prefix (str): file prefix.
            epoch (int): number in the file names.
            save_optimizer_states (bool): also write the optimizer states.
            remove_amp_cast (bool): see above; default True.
        """
        sym = self._fp32_symbol if remove_amp_cast else self._mp_symbol
        write_atomic('%s-symbol.json' % prefix, sym.tojson(remove_amp_cast=remove_amp_cast))
        param_name = '%s-%04d.params' % (prefix, epoch)
        arg_params, aux_params = self.get_params()
        save = {'arg:%s' % k: v.as_in_context(mx.cpu()) for k, v in arg_params.items()}
        save.update({'aux:%s' % k: v.as_in_context(mx.cpu()) for k, v in aux_params.items()})
        save_atomic(param_name, lambda tmp: nd.save(tmp, save))
        if save_optimizer_states:
            self.save_optimizer_states('%s-%04d.states' % (prefix, epoch))
        write_atomic('%s-%04d.mxmp.json' % (prefix, epoch),
                     json.dumps(self.mixed_precision_state(), indent=1, sort_keys=True))
        self.logger.info('Saved checkpoint to "%s" (loss scale %g, %d skipped steps)',
                         param_name, self.loss_scale, self.skipped_steps)

    def checkpoint_callback(self, prefix, period=1, save_optimizer_states=False):
        """An ``epoch_end_callback`` for ``fit`` that calls :meth:`save_checkpoint`.

        Unlike ``mx.callback.do_checkpoint`` it also saves the loss-scaling state.

        Args:
            prefix (str): file prefix.
            period (int): save every ``period`` epochs (epoch numbers start at 1 in the
                file names, as MXNet's callback).
            save_optimizer_states (bool): also save the optimizer states.
        """
        period = int(max(1, period))

        def _callback(iter_no, sym=None, arg=None, aux=None):   # pylint: disable=unused-argument
            if (iter_no + 1) % period == 0:
                self.save_checkpoint(prefix, iter_no + 1, save_optimizer_states)
        return _callback

    def _restore_state(self, state, fname):
        if not isinstance(state, dict) or state.get('format') != _STATES_FORMAT:
            raise ValueError('%s is not an mxmp.Module state file' % fname)
        if state.get('version') != _STATES_VERSION:
            raise ValueError('%s has format version %r; this mxmp reads version %d'
                             % (fname, state.get('version'), _STATES_VERSION))
        try:
            scaler = self._state.scaler.load_state_dict(state['loss_scaler'])
            skipped = int(state['skipped_steps'])
        except (KeyError, TypeError) as err:
            raise ValueError('%s misses a field: %s' % (fname, err)) from None
        except ValueError as err:
            raise ValueError('%s: %s' % (fname, err)) from None
        self._state.scaler = scaler
        self._state.skipped_steps = skipped
        self._written_scale = None
        self._write_loss_scale()

    @staticmethod
    def load(prefix, epoch, load_optimizer_states=False, **kwargs):
        """Create a Module from a checkpoint (mxmp's, or plain MXNet's).

        Args:
            prefix (str): file prefix (``prefix-symbol.json``, ``prefix-%04d.params``, and
                optionally ``prefix-%04d.states`` and ``prefix-%04d.mxmp.json``).
            epoch (int): the epoch number in the file names.
            load_optimizer_states (bool): load ``prefix-%04d.states`` at ``init_optimizer``.
            **kwargs: as for :class:`Module`. Without ``loss_scaler`` / ``target_dtype`` /
                ``cast_params`` / ``emulate``, those saved in ``prefix-%04d.mxmp.json`` are used
                (a plain MXNet checkpoint has none: the defaults apply). With a
                ``loss_scaler``, the saved state must match its class and configuration.

        Returns:
            Module: parameters set (float32 from the file), not bound.

        Raises:
            ValueError: the state file is malformed (not JSON, truncated), does not match
                ``loss_scaler``, or was written with another target dtype than the
                ``target_dtype``/``policy`` asked for (the message names the fix).
                Also when ``prefix-%04d.params`` or the symbol file is truncated or corrupt.
            OSError: a file cannot be read.
        """
        try:
            sym, args, auxs = mx.model.load_checkpoint(prefix, epoch)
        except mx.base.MXNetError as err:
            raise ValueError('the checkpoint %s-symbol.json / %s-%04d.params cannot be read: '
                             'truncated or corrupt (%s); load an earlier epoch'
                             % (prefix, prefix, epoch, mxnet_error_line(err, 200))) from None
        state, state_file, kwargs = read_state(prefix, epoch, kwargs)
        mod = Module(sym, **kwargs)
        mod._arg_params = _float32_params(args)
        mod._aux_params = auxs
        mod.params_initialized = True
        if state is not None:
            mod._restore_state(state, state_file)
        if load_optimizer_states:
            mod._preload_opt_states = '%s-%04d.states' % (prefix, epoch)
        return mod


def read_state(prefix, epoch, kwargs):
    """Read ``prefix-%04d.mxmp.json`` (if any) and fill in the Module keyword arguments.

    Returns ``(state or None, state file name, kwargs)``: without ``loss_scaler`` /
    ``target_dtype`` / ``cast_params`` / ``emulate`` in ``kwargs``, the saved ones are used.
    Raises ValueError as :meth:`Module.load` documents.
    """
    kwargs = dict(kwargs)
    state_file = '%s-%04d.mxmp.json' % (prefix, epoch)
    state = None
    if os.path.exists(state_file):
        with open(state_file, 'r', encoding='utf-8') as fin:
            try:
                state = json.load(fin)
            except ValueError as err:
                raise ValueError('%s is not valid JSON: %s' % (state_file, err)) from None
        if not isinstance(state, dict):
            raise ValueError('%s is not an mxmp.Module state file' % state_file)
        wanted = (kwargs['policy'].target_dtype if kwargs.get('policy') is not None
                  else kwargs.get('target_dtype'))
        if wanted is not None and 'target_dtype' in state and \
                normalize_dtype(wanted, allow_float32=True) != state['target_dtype']:
            raise ValueError(
                '%s was trained with target dtype %r but %r was asked for: its loss scaler '
                'and optimizer states belong to that precision. Omit target_dtype/policy to '
                'resume in %r; to change precision on purpose, load the float32 parameters '
                'with mx.model.load_checkpoint and set_params into a new Module'
                % (state_file, state['target_dtype'], wanted, state['target_dtype']))
        if 'policy' not in kwargs:
            for key in ('target_dtype', 'cast_params', 'emulate'):
                if key in state:
                    kwargs.setdefault(key, state[key])
        if 'loss_scaler' not in kwargs:
            kwargs['loss_scaler'] = _scaler_from_state(state.get('loss_scaler'),
                                                       state_file)
    return state, state_file, kwargs


def _float32_params(params):
    """Parameters as stored for a Module: low-precision ones widened to float32."""
    return {k: v.astype('float32') if is_low_precision(v.dtype) else v
            for k, v in params.items()}


def _scaler_from_state(state, fname):
    """Rebuild the saved loss scaler (class, configuration and running state)."""
    if not isinstance(state, dict) or state.get('class') not in _SCALER_CLASSES:
        raise ValueError('%s: unknown loss scaler state %r' % (fname, state))
    cls = _SCALER_CLASSES[state['class']]
    fields = {k: state[k] for k in cls._CONFIG_FIELDS + cls._STATE_FIELDS if k in state}
    try:
        return cls(**fields)
    except (TypeError, ValueError) as err:
        raise ValueError('%s: invalid loss scaler state: %s' % (fname, err)) from None
