"""Mixed-precision Symbolic Module: ``mx.mod.Module`` with mxmp's pass and dynamic loss scaling.

:class:`Module` is ``mx.mod.Module`` (MXNet 1.9.1, ``python/mxnet/module/module.py``) whose
symbol goes through :func:`mxmp.convert_symbol`, with the three pieces of mixed-precision
training (Micikevicius et al., "Mixed Precision Training", ICLR 2018; NVIDIA, "Training With
Mixed Precision" guide) that ``mxnet.contrib.amp`` gives Module users only in part (a static
loss scale through ``SoftmaxOutput(grad_scale=...)``):

1. **dynamic loss scaling without rebinding**: a *loss-scale node* sits in front of the loss
   outputs (:mod:`mxmp._src.graph.loss_heads`). It is an identity in the forward pass and
   multiplies the backward signal by the loss scale ``S``, which lives in an input array of
   the executors (the state ``__mxmp_loss_scale__``) that :meth:`Module.update` rewrites when
   ``S`` changes;
2. **overflow check**: after the kvstore has reduced the gradients, every gradient on every
   context is checked for inf/NaN; on overflow the update is skipped (weights, master
   weights and optimizer state stay bit-identical) and ``S`` backs off; otherwise the
   optimizer steps with ``rescale_grad = rescale_grad0 / S`` where ``rescale_grad0`` is what
   ``Module.init_optimizer`` sets (``1/batch_size``, times ``num_workers`` for dist_sync);
3. **float32 master weights** when ``cast_params=True``: as in :class:`mxmp.Trainer`
   (:mod:`mxmp._src.training.module_master_weights`).

The check of 2 and the update and write-back of 3 are mxmp's one training step,
:class:`mxmp._src.training.step.Step`, which :class:`mxmp.Trainer` runs too; the Module hands it
the reduced gradients.

Checkpoints (:mod:`mxmp._src.training.module_checkpoint`): :meth:`Module.save_checkpoint` writes the
float32 symbol (no casts, no loss-scale node) and float32 parameters (the master weights) that
plain MXNet loads, plus ``prefix-%04d.mxmp.json`` with the loss scaler and skipped steps;
:meth:`Module.load` restores all of it, and loads plain-MXNet checkpoints too.
"""
import logging
from operator import attrgetter

import mxnet as mx

from ..device import lp_kernels_available
from ..dtypes import normalize_dtype
from ..graph.convert import convert_symbol
from ..graph.strip import remove_casts
from ..graph.stem import check_option as check_pad_stem, pad_stem, wants_padding
from ..graph.loss_heads import (LOSS_SCALE_NAME, insert_loss_scale, lp_variable_names,
    scaled_loss_ops)
from ..policy.policy import Policy
from ..scaling.overflow import all_finite
from ..scaling.scalers import make_loss_scaler
from . import module_checkpoint
from .module_kvstore import reduced_updates, start_kvstore
from .module_loss_scale import LossScaleInputModule
from .module_master_weights import MasterWeightsModule
from .updater import Updater
from .step import Step, StepOwnerMixin

__all__ = ['Module']


def _resolve_policy(target_dtype, policy, emulate, context):
    """``(target dtype, policy or None)`` of a Module; checks the contexts' kernels."""
    if policy is not None:
        if not isinstance(policy, Policy):
            raise TypeError('policy must be an mxmp.Policy, got %s' % type(policy).__name__)
        if emulate and policy.emulate is not True:
            policy = policy.replace(emulate=True)
        target = policy.target_dtype
    else:
        target = normalize_dtype(target_dtype, allow_float32=True)
        policy = None if target == 'float32' else Policy(target, emulate=emulate)
    contexts = [context] if isinstance(context, mx.Context) else list(context)
    if policy is not None and policy.emulate is not True:
        for ctx in contexts:
            if not lp_kernels_available(target, ctx):
                raise RuntimeError(
                    '%s has no %s kernels (oneDNN needs AVX-512 for bfloat16; CPUs have no '
                    'float16 GEMM). Pass emulate=True to run the same numerics with '
                    'float32 kernels, or target_dtype="float32".' % (ctx, target))
    return target, policy


def _create_optimizer(module, optimizer, optimizer_params, batch_size):
    """The Optimizer of ``init_optimizer``: one index per parameter and context, as MXNet's
    update without kvstore; ``rescale_grad`` defaults to ``1/batch_size``."""
    ndev = len(module._context)
    idx2name = {i * ndev + k: name
                for i, name in enumerate(module._exec_group.param_names)
                for k in range(ndev)}
    if isinstance(optimizer, str):
        params = dict(optimizer_params)
        params.setdefault('rescale_grad', 1.0 / batch_size)
        return mx.optimizer.create(optimizer, sym=module.symbol,
                                   param_idx2name=idx2name, **params)
    if isinstance(optimizer, mx.optimizer.Optimizer):
        if optimizer.rescale_grad != 1.0 / batch_size:
            module.logger.warning('the optimizer\'s rescale_grad is %s, not 1/batch_size = '
                                  '%s; mxmp divides it by the loss scale at every step',
                                  optimizer.rescale_grad, 1.0 / batch_size)
        if not optimizer.idx2name:
            optimizer.idx2name = dict(idx2name)
        return optimizer
    raise TypeError('optimizer must be a name or an mx.optimizer.Optimizer, got %s'
                    % type(optimizer).__name__)


def _doc(func):
    """Decorator: the method's docstring is ``func``'s (the function the method calls, where
    the documentation lives once)."""
    def decorate(method):
        method.__doc__ = func.__doc__
        return method
    return decorate


class Module(StepOwnerMixin, MasterWeightsModule, LossScaleInputModule):
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
        loss_scaler: anything :func:`mxmp._src.scaling.scalers.make_loss_scaler` accepts: None/'auto'
            (default: dynamic for float16, none for bfloat16/float32, since bfloat16 has
            float32's exponent range), 'dynamic', 'static', 'none', a number (static scale)
            or a :class:`mxmp.LossScaler`.
        cast_params (bool): store the weights of low-precision layers in the target dtype on
            the contexts (no cast per iteration) and keep float32 master weights for them
            (:mod:`mxmp._src.training.master_weights`); default False (float32 weights, one
            in-graph cast each).
            ``get_params`` and checkpoints always hold the float32 master weights.
        emulate (bool): float32 kernels with low-precision rounding (``mxmp._src.graph``), for
            machines without low-precision kernels (``mxmp.lp_kernels_available``); default
            False.
        policy (mxmp.Policy or None): op classes and overrides; default
            ``Policy(target_dtype, emulate=emulate)``.
        pad_stem ('auto', True or False): at :meth:`bind`, when the data shapes are known,
            feed a Convolution whose data is an input with an odd channel count (an image
            network's 3-channel stem) a zero channel more and its weight a zero column, in the
            graph (the same function and parameters; :mod:`mxmp._src.graph.stem`). Default
            ``'auto'``: for bfloat16 where the real kernels run, as :func:`mxmp.convert`.
        state_names, logger, context, work_load_list, fixed_param_names, group2ctxs,
            compression_params: as for ``mx.mod.Module`` (keyword-only here).

    Raises:
        ValueError: unknown ``target_dtype``, ``loss_scaler`` or ``pad_stem``; a symbol that
            already holds the loss-scale input.
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

    BucketingModule: see :class:`mxmp._src.training.bucketing.BucketingModule`.
    """

    _rescale_grad = None   # rescale_grad0 (init_optimizer): the factor without the loss scale

    def __init__(self, symbol, data_names=('data',), label_names=('softmax_label',), *,
                 target_dtype='bfloat16', loss_scaler=None, cast_params=False, emulate=False,
                 policy=None, pad_stem='auto', state_names=None, logger=logging, context=None,
                 **module_kwargs):
        if not isinstance(symbol, mx.sym.Symbol):
            raise TypeError('mxmp.Module needs an mx.sym.Symbol, got %s; for a Gluon block use '
                            'mxmp.convert(block) and mxmp.Trainer' % type(symbol).__name__)
        if LOSS_SCALE_NAME in symbol.list_arguments():
            raise ValueError('the symbol already holds the loss-scale input %r: pass the '
                             'float32 graph (module.symbol), not module.mxmp_symbol'
                             % LOSS_SCALE_NAME)
        self._pad_stem = check_pad_stem(pad_stem)
        context = mx.cpu() if context is None else context
        target, policy = _resolve_policy(target_dtype, policy, emulate, context)
        self._target_dtype = target
        self._policy = policy
        self._cast_params = bool(cast_params) and policy is not None
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
        self._step = Step(make_loss_scaler(loss_scaler, target))   # shared by buckets
        self._scale_nodes = 0
        bound = mp_symbol
        if self._step.scaler.enabled:
            bound, self._scale_nodes = insert_loss_scale(mp_symbol, scaled_loss_ops(policy))
            if self._scale_nodes:
                state_names = state_names + [LOSS_SCALE_NAME]
        super().__init__(bound, data_names, label_names, logger=logger, context=context,
                         state_names=state_names, **module_kwargs)

    # ------------------------------------------------------------------ properties
    symbol = property(attrgetter('_fp32_symbol'), doc='mx.sym.Symbol: the float32 network '
                      '(no casts, no loss-scale node).')
    mxmp_symbol = property(attrgetter('_symbol'), doc='mx.sym.Symbol: the graph the executors '
                           'run (casts and loss-scale node).')
    target_dtype = property(attrgetter('_target_dtype'),
                            doc="str: ``'float16'``, ``'bfloat16'`` or ``'float32'``.")
    policy = property(attrgetter('_policy'),
                      doc='mxmp.Policy or None (float32): the policy of the pass.')
    cast_params = property(attrgetter('_cast_params'), doc='bool: whether low-precision '
                           'weights are stored in the target dtype.')

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
        if wants_padding(self._pad_stem, self._policy, self._context[0]):
            self._symbol = pad_stem(self._symbol, {d[0]: tuple(d[1]) for d in data_shapes})
        super().bind(data_shapes, label_shapes, for_training, inputs_need_grad, force_rebind,
                     shared_module, grad_req)
        if shared_module is not None:
            self._step = shared_module._step
        else:
            self._params_bound(fresh)
        self._write_loss_scale(force=True)
        return None

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
        optimizer = _create_optimizer(self, optimizer, optimizer_params, batch_size)
        self._rescale_grad = optimizer.rescale_grad
        self._optimizer = optimizer
        self._kvstore = kv
        self._update_on_kvstore = False
        if kv:
            start_kvstore(self, kv)
        self._updater = Updater(optimizer)  # SGD on a CPU: one weight per kernel call (updater.py)
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
        self._step = shared_module._step
        self._rescale_grad = shared_module._rescale_grad

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
            mxmp._src.errors.LossScaleAtFloorError: the loss scale stayed at its floor for
                ``max_overflows_at_floor`` consecutive overflows (the message names the
                parameters whose gradients were inf/NaN); nothing is updated.

        Warns:
            mxmp._src.errors.NonFiniteForwardWarning: the update is skipped and the outputs of
                the forward pass were themselves inf/NaN (not an overflow from scaling).
        """
        assert self.binded and self.params_initialized and self.optimizer_initialized
        self._params_dirty = True
        group, ndev = self._exec_group, len(self._context)
        applied = self._step.apply(
            reduced_updates(self), self._optimizer, self._rescale_grad,
            name_of=lambda idx: group.param_names[idx // ndev],
            forward_finite=lambda: all_finite(group.get_outputs(merge_multi_context=False)))
        self._write_loss_scale()
        return applied

    # ------------------------------------------------------------------ checkpoints
    @_doc(module_checkpoint.save_optimizer_states)
    def save_optimizer_states(self, fname):
        assert self.optimizer_initialized
        module_checkpoint.save_optimizer_states(self, fname)

    @_doc(module_checkpoint.load_optimizer_states)
    def load_optimizer_states(self, fname):
        assert self.optimizer_initialized
        module_checkpoint.load_optimizer_states(self, fname)

    @_doc(module_checkpoint.mixed_precision_state)
    def mixed_precision_state(self):
        return module_checkpoint.mixed_precision_state(self)

    @_doc(module_checkpoint.save_checkpoint)
    def save_checkpoint(self, prefix, epoch, save_optimizer_states=False, remove_amp_cast=True):
        module_checkpoint.save_checkpoint(self, prefix, epoch, save_optimizer_states,
                                          remove_amp_cast)

    @_doc(module_checkpoint.checkpoint_callback)
    def checkpoint_callback(self, prefix, period=1, save_optimizer_states=False):
        return module_checkpoint.checkpoint_callback(self, prefix, period, save_optimizer_states)

    def _restore_state(self, state, fname):
        self._step.scaler, self._step.skipped_steps = module_checkpoint.restore_state(
            self._step.scaler, state, fname)
        self._write_loss_scale(force=True)

    @staticmethod
    @_doc(module_checkpoint.load_module)
    def load(prefix, epoch, load_optimizer_states=False, **kwargs):
        return module_checkpoint.load_module(Module, prefix, epoch, load_optimizer_states,
                                             kwargs)
