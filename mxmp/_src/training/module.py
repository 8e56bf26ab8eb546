"""mxmp.Module: ``mx.mod.Module`` whose symbol goes through :func:`mxmp.convert_symbol`, with
the loss scale applied wherever a gradient enters the backward pass
(:mod:`mxmp._src.graph.loss_heads`) and the training step of
:class:`mxmp._src.training.step.Step`."""
import logging
from operator import attrgetter

import mxnet as mx
from mxnet import nd

from ..distributed import check_kvstore_args
from ..graph.accumulate import accumulating_names, guard_accumulated_grads
from ..graph.convert import convert_symbol
from ..graph.loss_heads import LOSS_SCALE_NAME, insert_loss_scale, opaque_ops, scaled_loss_ops
from ..graph.output_names import keep_output_names
from ..graph.stem import check_option as check_pad_stem, pad_stem, wants_padding
from ..graph.strip import remove_casts
from ..graph.symbol_json import cast_param_names
from ..scaling import divide, multiply
from . import module_checkpoint as files
from .module_parts import ModuleMasters, module_policy, reduced_updates, start_kvstore
from .step import Step, all_finite
from .trainer import resolve_precision
from .updater import Updater

__all__ = ['Module']


class Module(files.ModuleCheckpoints, mx.mod.Module):
    """``mx.mod.Module`` training in mixed precision with dynamic loss scaling.

    Args:
        symbol (mx.sym.Symbol): the float32 network with its loss output(s).
        target_dtype (str or None): ``'bfloat16'`` (None without a policy), ``'float16'`` or
            ``'float32'`` (no conversion).
        loss_scaler: as :func:`mxmp.make_loss_scaler`; default: the policy's, else 'auto'.
        cast_params, emulate, policy: :func:`~mxmp._src.training.module_parts.module_policy`
            (defaults None, 'auto', ``Policy(target_dtype)``).
        pad_stem ('auto', True or False): as :func:`mxmp.convert`, applied at :meth:`bind`.
        Others: as for ``mx.mod.Module`` (keyword-only after ``label_names``).

    Raises:
        ValueError: unknown ``target_dtype``, ``loss_scaler`` or ``pad_stem``; a symbol that
            already holds the loss-scale input; with loss scaling, an op whose backward mxmp
            cannot see (a ``Custom`` op...) in low precision (:func:`~mxmp._src.graph.
            loss_heads.insert_loss_scale`); what ``module_policy`` raises.
        mxmp.GpuProbeError: a GPU context that failed the kernel probe (MXNet's message).

    Unlike ``mx.mod.Module``: :attr:`symbol` is the float32 graph; the optimizer runs in the
    Module (a kvstore only reduces gradients; async kvstores are refused); :meth:`update`
    returns whether the step was applied; ``out_grads`` and input gradients are unscaled.
    """

    _rescale_grad = None   # rescale_grad0 (init_optimizer): the factor without the loss scale
    _scale_written = None  # the value in the loss-scale input (until the executors change)
    _backward_scale = None  # the loss scale of the last backward() (None: unscaled)

    def __init__(self, symbol, data_names=('data',), label_names=('softmax_label',), *,
                 target_dtype=None, loss_scaler=None, cast_params=None, emulate='auto',
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
        contexts = [context] if isinstance(context, mx.Context) else list(context)
        self._target_dtype, self._policy, self._cast_params, self._chosen = module_policy(
            target_dtype, policy, cast_params, emulate, contexts)
        self._fp32_symbol = remove_casts(symbol)
        mp_symbol = self._fp32_symbol if self._policy is None else convert_symbol(
            self._fp32_symbol, policy=self._policy, cast_params=self._cast_params,
            data_names=[*(data_names or ()), *(label_names or ()), *(state_names or ())])
        if self._policy is not None:   # the float32 graph's output names, as mx.mod.Module
            mp_symbol = keep_output_names(mp_symbol, self._fp32_symbol.list_outputs())
        self._mp_symbol = mp_symbol
        self._masters = ModuleMasters(cast_param_names(mp_symbol) if self._cast_params
                                      else frozenset())
        self._step = Step(resolve_precision([], self._policy, self._target_dtype,
                                            loss_scaler)[1])
        bound, nodes, self._raw_heads = mp_symbol, 0, frozenset()
        if self._step.scaler.enabled:
            bound, nodes, self._raw_heads = insert_loss_scale(
                mp_symbol, scaled_loss_ops(self._policy), opaque_ops(mp_symbol, self._policy))
            if nodes:
                state_names = [*(state_names or ()), LOSS_SCALE_NAME]
        self._loss_scale_nodes = nodes
        super().__init__(bound, data_names, label_names, logger=logger, context=context,
                         state_names=state_names, **module_kwargs)

    symbol = property(attrgetter('_fp32_symbol'), doc='mx.sym.Symbol: the float32 network.')
    mxmp_symbol = property(attrgetter('_symbol'), doc='mx.sym.Symbol: the bound graph.')
    target_dtype = property(attrgetter('_target_dtype'), doc='str: the target dtype.')
    policy = property(attrgetter('_policy'), doc='mxmp.Policy or None (float32).')
    cast_params = property(attrgetter('_cast_params'), doc='bool: low-precision weights.')
    loss_scaler = property(lambda self: self._step.scaler,
                           doc='mxmp.LossScaler: the current loss scaler.')
    loss_scale = property(lambda self: float(self._step.scaler.scale),
                          doc='float: the current loss scale (1.0 when scaling is disabled).')
    skipped_steps = property(lambda self: self._step.skipped_steps,
                             doc='int: updates skipped because a gradient was inf/NaN.')
    loss_scale_nodes = property(attrgetter('_loss_scale_nodes'), doc='int: loss-scale nodes '
                                'in the bound graph (0 when scaling is disabled).')

    def _share(self, other):
        """Share ``other``'s loss scaler, skipped count and masters (buckets)."""
        self._step, self._masters = other._step, other._masters
        self._rescale_grad = other._rescale_grad

    def _write_loss_scale(self, force=False):
        """Write the loss scale into the executors' loss-scale input unless they hold it."""
        scale = self.loss_scale
        if self._loss_scale_nodes and self.binded and (force or self._scale_written != scale):
            for executor in self._exec_group.execs:
                executor.arg_dict[LOSS_SCALE_NAME][:] = scale
            self._scale_written = scale

    # ------------------------------------------------------------------ Module API
    def bind(self, data_shapes, label_shapes=None, for_training=True, inputs_need_grad=False,
             force_rebind=False, shared_module=None, grad_req='write'):
        """As ``mx.mod.Module.bind``; a re-bind keeps the (float32 master) parameters."""
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
        if for_training and self._policy is not None:   # graph/accumulate.py: grad_req='add'
            self._symbol = guard_accumulated_grads(
                self._symbol, accumulating_names(self._symbol, grad_req))
        super().bind(data_shapes, label_shapes, for_training, inputs_need_grad, force_rebind,
                     shared_module, grad_req)
        if shared_module is not None:
            self._share(shared_module)
        elif fresh and not self.params_initialized:
            for name in self._masters.lp_names:   # initializers cannot fill bfloat16
                arr = self._arg_params[name]
                self._arg_params[name] = nd.zeros(arr.shape, dtype='float32')
        elif self.params_initialized:
            self._masters.written(self._arg_params, self._exec_group, self.for_training)
        self._write_loss_scale(force=True)
        return None

    def init_optimizer(self, kvstore='local', optimizer='sgd',
                       optimizer_params=(('learning_rate', 0.01),), force_init=False):
        """As ``mx.mod.Module.init_optimizer``; the optimizer runs in the Module."""
        assert self.binded and self.params_initialized, \
            'call bind and init_params before init_optimizer'
        if self.optimizer_initialized and not force_init:
            self.logger.warning('optimizer already initialized, ignoring...')
            return
        check_kvstore_args(kvstore, None)
        if self._params_dirty:
            self._sync_params_from_devices()
        kv, _ = mx.model._create_kvstore(kvstore, len(self._context), self._arg_params)
        self._optimizer = _create_optimizer(self, optimizer, optimizer_params, kv)
        self._rescale_grad = self._optimizer.rescale_grad
        self._kvstore, self._update_on_kvstore = kv, False
        if kv:
            self.logger.info('mxmp.Module: update_on_kvstore=False on the %r kvstore: it only '
                             'reduces the gradients', kv.type)
            if start_kvstore(kv, self._exec_group.param_names, self._arg_params,
                             self._compression_params):
                self.set_params(self._arg_params, self._aux_params, force_init=True)
        self._updater = Updater(self._optimizer)
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
        self._share(shared_module)

    def update(self):
        """Reduce, check and apply the gradients; False if skipped (as mxmp.Trainer.step)."""
        assert self.binded and self.params_initialized and self.optimizer_initialized
        self._params_dirty = True
        group, ndev = self._exec_group, len(self._context)
        applied = self._step.apply(
            reduced_updates(group, self._kvstore, self._masters, self._updater),
            self._optimizer, self._rescale_grad,
            name_of=lambda idx: group.param_names[idx // ndev],
            # get_outputs(False) is per output, then per device: all_finite takes per device
            forward_finite=lambda: all_finite(
                [list(arrays) for arrays in zip(*group.get_outputs(merge_multi_context=False))]))
        self._write_loss_scale()
        return applied

    # ------------------------------------------------------------------ the loss-scale input
    def reshape(self, data_shapes, label_shapes=None):
        """As ``mx.mod.Module.reshape``."""
        super().reshape(data_shapes, label_shapes)
        self._write_loss_scale(force=True)

    def forward(self, data_batch, is_train=None):
        """As ``mx.mod.Module.forward`` (outputs bit-identical to no loss scaling)."""
        self._write_loss_scale()
        super().forward(data_batch, is_train)

    def backward(self, out_grads=None):
        """As ``mx.mod.Module.backward``; ``out_grads`` are multiplied by the loss scale
        (in float32 for float16/bfloat16 ones: MXNet would round 2**16 to inf in float16),
        except those of outputs made by an op whose backward mxmp brackets
        (:data:`mxmp._src.graph.loss_heads.OPAQUE_GRADIENT_OPS`), which scales itself."""
        self._write_loss_scale()
        scale = self.loss_scale if self.loss_scaler.enabled else None
        if out_grads is not None and scale is not None:
            if isinstance(out_grads, nd.NDArray):
                out_grads = [out_grads]
            out_grads = [g if k in self._raw_heads else multiply(g, scale)
                         for k, g in enumerate(out_grads)]
        super().backward(out_grads)
        self._backward_scale = scale

    def get_input_grads(self, merge_multi_context=True):
        """As ``mx.mod.Module.get_input_grads``: divided by the loss scale the last
        :meth:`backward` used (an :meth:`update` since may have changed the current one), in
        float32 and rounded once to each gradient's dtype (a float16 input's gradient divided
        in float16 by 2**16, inf there, would be 0); new arrays of the gradients' dtypes."""
        grads = super().get_input_grads(merge_multi_context)
        scale = self._backward_scale
        if scale is None:
            return grads

        def unscaled(grad):
            return divide(grad, scale, out=nd.empty(grad.shape, grad.context, grad.dtype))
        if merge_multi_context:
            return [unscaled(g) for g in grads]
        return [[unscaled(g) for g in per_ctx] for per_ctx in grads]

    def get_states(self, merge_multi_context=True):
        """As ``mx.mod.Module.get_states``, without the loss-scale input."""
        states = super().get_states(merge_multi_context)
        return states[:-1] if self._loss_scale_nodes else states

    def set_states(self, states=None, value=None):
        """As ``mx.mod.Module.set_states``; the loss-scale input is kept."""
        super().set_states(states, value)
        self._write_loss_scale(force=True)

    # ------------------------------------------------------------------ master weights
    def master_weights(self, name):
        """The float32 masters (one per context) of low-precision parameter ``name``."""
        if name not in self._masters.lp_names:
            raise ValueError('parameter %r has no master weights: only the parameters stored '
                             'in the target dtype (cast_params=True) have them: %s'
                             % (name, sorted(self._masters.lp_names)))
        if not (self.binded and self.params_initialized):
            raise ValueError('bind and initialize the Module before asking for master weights')
        if not self.for_training:
            raise ValueError('an inference-only bind (for_training=False) keeps no master '
                             'weights: the float32 values are the host parameters, '
                             'get_params(); bind with for_training=True to train')
        return self._masters.of(name, self._exec_group)

    def init_params(self, initializer=mx.init.Uniform(0.01), arg_params=None, aux_params=None,
                    allow_missing=False, force_init=False, allow_extra=False):
        """As ``mx.mod.Module.init_params``; master weights follow."""
        again = not self.params_initialized or force_init
        super().init_params(initializer, arg_params, aux_params, allow_missing, force_init,
                            allow_extra)
        if again:
            self._masters.written(self._arg_params, self._exec_group, self.for_training)

    def set_params(self, arg_params, aux_params, allow_missing=False, force_init=True,
                   allow_extra=False):
        """As ``mx.mod.Module.set_params`` (float32 values); master weights follow."""
        ignored = self.params_initialized and not force_init
        super().set_params(arg_params, aux_params, allow_missing, force_init, allow_extra)
        if allow_missing and not ignored:
            self._masters.written(arg_params, self._exec_group, self.for_training)

    def _sync_params_from_devices(self):
        # BatchNorm's moving statistics are written outside the engine's tracking: wait
        nd.waitall()
        super()._sync_params_from_devices()
        self._masters.to_host(self._arg_params)

    # ------------------------------------------------------------------ checkpoints
    @staticmethod
    def load(prefix, epoch, load_optimizer_states=False, **kwargs):
        """A Module from a checkpoint (mxmp's, or plain MXNet's), parameters set, not bound;
        ``kwargs`` as for :class:`Module`, defaulting to the JSON file's settings (the saved
        policy, whose ``emulate`` is resolved again for this machine's contexts; ``emulate``
        and ``cast_params`` given here replace the saved ones); a ``policy`` given must agree
        with the file (target dtype, kind of loss scaler), the saved scaler state is restored
        into it; ``load_optimizer_states``: load ``prefix-%04d.states`` at ``init_optimizer``.
        ValueError for a bad file or a precision that disagrees with the saved one."""
        sym, args, auxs = files.load_params(prefix, epoch, with_symbol=True)
        state, state_file, kwargs = files.read_state(prefix, epoch, kwargs)
        mod = Module(sym, **kwargs)
        mod.set_loaded(args, auxs, state, state_file)
        if load_optimizer_states:
            mod._preload_opt_states = '%s-%04d.states' % (prefix, epoch)
        return mod


def _create_optimizer(module, optimizer, optimizer_params, kv):
    """The Optimizer of ``init_optimizer``: one index per parameter and context, as MXNet's
    update without kvstore; ``rescale_grad`` defaults to ``1/batch_size`` (the global batch
    over a dist_*sync kvstore ``kv``)."""
    batch_size = module._exec_group.batch_size
    if kv and 'dist' in kv.type and '_sync' in kv.type:
        batch_size *= kv.num_workers
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
