"""Mixed precision inside the user's own Gluon network: :func:`convert` and the process-wide
switch of :func:`mxmp.amp.init`.

**The one module of mxmp that hooks MXNet's classes** (``import mxmp`` only wraps MXNet's graph
loaders: :func:`mxmp._src.graph.symbol_json.install_symbol_loaders`). :func:`install_hooks` (the
first :func:`convert`, ``amp.init`` or mxmp.Trainer) wraps ``HybridBlock._build_cache`` (the
graph of a converted block, or of the hybridized parent of one, :mod:`mxmp._src.block_scope`,
goes through the pass, :func:`mxmp._src.gluon_graph.rewrite`), ``_call_cached_op`` (default
layout for grouped weights; the fused twin; calls :func:`mxmp.freeze` forbids), ``forward`` (a
converted block not hybridized raises; under ``amp.init`` an imperative call warns once),
``export``, ``Block.save_parameters``/``load_parameters`` and ``ParameterDict.save``/``load``
(files plain MXNet loads; loading casts and sets the masters),
``Parameter.set_data`` (fused graphs rebuilt, masters follow), ``Parameter.initialize`` and
``ParameterDict.zero_grad`` (no bfloat16 in MXNet: :mod:`mxmp._src.param_dtypes`).
:func:`remove_hooks` undoes all of it. Converted blocks are kept here in weak dictionaries:
nothing is stamped on MXNet's objects but contrib.amp's own hook on a ``gluon.Trainer``
(:func:`attach_trainer_loss_scaler`, for :mod:`mxmp.amp`).
"""
import importlib
import logging
import threading
import warnings
import weakref

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon.block import _flatten, _regroup

from .gluon_graph import (PARAM_POLICY, STORED_FROM, Conversion, build_in_walk_order,
                          cast_deferred, rewrite, unrounded_values, value_changed)
from .policy.policy import resolve_policy

__all__ = ['convert', 'converted_graph', 'fused_graph', 'set_global', 'install_hooks',
           'remove_hooks', 'attach_trainer_loss_scaler', 'conversion_of', 'release_built',
           'mark_frozen', 'check_frozen']

logger = logging.getLogger('mxmp.gluon')

_CONVERTED = weakref.WeakKeyDictionary()   # block -> Conversion (mxmp.convert)
_BUILT = weakref.WeakKeyDictionary()       # block -> BuiltGraph of its current graph
_ACCUMULATING = weakref.WeakKeyDictionary()  # block -> (Parameters, grad_req='add' names) at build
_FROZEN = weakref.WeakKeyDictionary()      # block made by mxmp.freeze -> name of its source
_CONSUMED = weakref.WeakKeyDictionary()    # block mxmp.freeze took the arrays of -> True
_GLOBAL = [None]                           # the Conversion of mxmp.amp.init, or None
_ORIGINAL = {}                             # method name -> MXNet's function (_WRAPPERS)
_LOCAL = threading.local()                 # depth (amp.init's warning), inference_call
_WARNED = set()
_EPOCH = [0]                               # convert calls so far (stale graphs of parents)
_CHECKED = weakref.WeakKeyDictionary()     # unconverted block -> _state() its graph was checked at


def converted_graph(block):
    """The mixed-precision Symbol a converted, hybridized ``block`` runs (casts included).

    Raises:
        RuntimeError: no graph built since the last cache clear, or the block is not converted.
    """
    built = _BUILT.get(block)
    if built is None or not block._cached_graph:
        from .block_scope import no_graph_message
        raise RuntimeError(no_graph_message(block, [b for b in _BUILT.keys() if b._cached_graph]))
    return built.symbol


def fused_graph(block):
    """The oneDNN-fused inference Symbol of a converted block, or None until an inference
    call ran fused (see ``fuse_inference`` of :func:`convert`)."""
    built = _BUILT.get(block)
    return None if built is None or built.fused is None else built.fused.symbol


def set_global(conversion):
    """Turn the process-wide switch on (a :class:`Conversion`) or off (None): HybridBlocks not
    converted by :func:`convert` build their next graphs with it."""
    if conversion is not None:
        install_hooks()
    _GLOBAL[0] = conversion


def convert(block, target_dtype=None, cast_params=None, emulate=None, policy=None,
            fuse_inference='auto', pad_stem='auto', fold_batchnorm=True):
    """Make ``block`` compute in mixed precision, in place, and return it.

    Every graph MXNet builds for the block from now on (either training mode, any input
    structure, after every cache clear) goes through :func:`mxmp.convert_symbol`. The block
    stays the user's object (methods, children, Parameters and their names unchanged); a
    Trainer over ``block.collect_params()`` trains it.

    Args:
        block (mxnet.gluon.HybridBlock or gluon.Block): initialized or not; hybridized here if
            it is not. A plain ``gluon.Block`` (Python ``forward``, e.g. GluonNLP's
            ``NMTModel``): each of its outermost HybridBlock descendants is converted, and its
            own Python code runs as written (float32 between them).
        target_dtype (str): shorthand for ``policy.target_dtype`` (default ``'bfloat16'``).
        cast_params (bool): shorthand for ``policy.param_dtype``: True stores the weights of
            low-precision layers in the target dtype (rounded to nearest even; cast once they
            are initialized); train with :class:`mxmp.Trainer`, which keeps float32 master
            weights made from the values before the cast. Default: float32 weights.
        emulate ('auto', True or False): shorthand for ``policy.emulate``; ``'auto'``: emulate
            where the call's context has no kernels (warned once); False there raises
            RuntimeError at the call.
        policy (mxmp.Policy): every precision setting; default ``Policy(target_dtype)``.
        fuse_inference ('auto', True or False): inference calls on a CPU run a oneDNN-fused
            twin graph sharing the Parameters. ``'auto'``: where the real kernels run and
            ``MXNET_SUBGRAPH_BACKEND`` is not ``NONE``.
        pad_stem ('auto', True or False): feed an odd-channel NCHW stem Convolution one zero
            channel more (:mod:`mxmp._src.graph.stem`); ``'auto'``: bfloat16 on real kernels.
        fold_batchnorm (bool): in the fused inference graph on real kernels, fold each
            BatchNorm that follows a Convolution into its weight and bias in float32, rounded
            once to nearest even (:mod:`mxmp._src.graph.fold`: MXNet's own fold truncates to
            bfloat16, which cost accuracy on trained networks; docs/benchmark.md "Fused
            inference"). False leaves the folding to MXNet. Default True.

    Returns:
        mxnet.gluon.HybridBlock (or the plain Block given): ``block``, with float32 outputs;
        ``export`` and ``save_parameters`` write float32 files plain MXNet loads.

    Raises:
        TypeError: ``block`` is neither a HybridBlock nor a Block holding one.
        ValueError: unknown dtype; a shorthand contradicting ``policy``; bad ``emulate``,
            ``fuse_inference``, ``pad_stem`` or ``fold_batchnorm``; the block was converted
            with other settings.
    """
    if not isinstance(block, gluon.HybridBlock):
        from .block_tree import hybrid_parts_to_convert   # a plain Block: the graphs inside
        for part in hybrid_parts_to_convert(block):
            convert(part, target_dtype, cast_params, emulate, policy, fuse_inference, pad_stem,
                    fold_batchnorm)
        return block
    policy = resolve_policy(policy, target_dtype, cast_params, emulate)
    conversion = Conversion(policy, fuse_inference, pad_stem, fold_batchnorm)
    if _CONVERTED.get(block) == conversion:
        return block
    from .block_tree import refuse_second_policy   # one graph, one policy
    refuse_second_policy(block, conversion, _CONVERTED)
    install_hooks()
    def register(child):   # the block and every HybridBlock inside it (Block.apply)
        if isinstance(child, gluon.HybridBlock):
            _CONVERTED[child] = conversion
            child._clear_cached_op()
    block.apply(register)
    _EPOCH[0] += 1
    for param in block.collect_params().values():
        PARAM_POLICY[param] = policy
    if isinstance(block, gluon.SymbolBlock):   # a fixed graph: converted (and cast) now
        ctxs = [c for p in block.collect_params().values() if p._ctx_list for c in p._ctx_list]
        _convert_graph(block, conversion, (), ctxs[0] if ctxs else None)
    elif policy.cast_params:
        _param_dtypes().cast_params_now(block, policy)
    if not block._active:
        logger.info('mxmp.convert: hybridizing %s (mixed precision runs in its graph)', block.name)
        block.hybridize()
    return block


def conversion_of(block):
    """The :class:`Conversion` :func:`convert` gave ``block``, or None."""
    return _CONVERTED.get(block)


def release_built(block):
    """Forget the graphs and master values of ``block`` and its children (for mxmp.freeze)."""
    for child in [b for b in list(_BUILT.keys()) + [block] if b is block or b in _CONVERTED]:
        built = _BUILT.pop(child, None)
        if built is not None and built.fused is not None:
            built.fused.reset()
        child._clear_cached_op()
    for param in block.collect_params().values():
        unrounded_values(param)   # taken and dropped


def mark_frozen(block, frozen):
    """``frozen`` (a SymbolBlock) is :func:`mxmp.freeze`'s network made from ``block``: it
    refuses training calls, ``block`` and its children every call (:func:`check_frozen`)."""
    _FROZEN[frozen] = block.name
    block.apply(lambda child: _CONSUMED.__setitem__(child, block.name))


def check_frozen(block):
    """Raise RuntimeError for a call :func:`mxmp.freeze` forbids (``freeze.check_call``)."""
    from .frozen_calls import check_call   # only once mxmp.freeze ran
    check_call(block, _CONSUMED.get(block), _FROZEN.get(block))


def _applies(block):
    """The Conversion for ``block``'s graph: its own, else the switch's (not for SymbolBlocks,
    whose graph was not built by operators, as with contrib.amp's init)."""
    conversion = _CONVERTED.get(block)
    if conversion is None and not isinstance(block, gluon.SymbolBlock):
        conversion = _GLOBAL[0]
    return conversion


def _convert_graph(block, conversion, args, ctx=None, keep_unrounded=True, inside=()):
    """Rewrite ``block``'s cached graph with the pass unless it is already the converted one
    (``keep_unrounded``: see :func:`mxmp._src.gluon_graph.cast_to_graph`; ``inside``: the
    converted blocks whose nodes alone are planned, :mod:`mxmp._src.block_scope`)."""
    inputs, sym = block._get_graph(*args)
    built = _BUILT.get(block)
    if built is not None and built.symbol is sym:
        return
    if inside:
        from .block_scope import scoped_conversion
        conversion = scoped_conversion(block, inside, conversion, sym)
    built = rewrite(block, conversion, inputs, sym, args, ctx, keep_unrounded)
    params = tuple(block.collect_params().values())
    accumulating = _accumulating(params)
    _ACCUMULATING[block] = params, accumulating
    if accumulating:   # MXNet's cast backward ignores grad_req='add' (graph/accumulate.py)
        from .graph.accumulate import guard_accumulated_grads   # lazily: import budget
        built.symbol = guard_accumulated_grads(built.symbol, accumulating)
    if conversion is _GLOBAL[0]:
        for param in block.collect_params().values():
            PARAM_POLICY.setdefault(param, conversion.policy)
    _BUILT[block] = built
    block._cached_graph = inputs, built.symbol


def _build_cache(self, *args):
    conversion, inside = _applies(self), ()
    if conversion is None:   # converted children planned in this graph, else no low weights
        inside, conversion = _inside(self)
    # only a build by an inference call drops the master values (BuiltGraph.before_call)
    keep = not getattr(_LOCAL, 'inference_call', False)
    if conversion is not None:
        _convert_graph(self, conversion, args, keep_unrounded=keep, inside=inside)
        build_in_walk_order(self, _ORIGINAL['_build_cache'], args)
    else:
        _ORIGINAL['_build_cache'](self, *args)
    if conversion is not None:
        cast_deferred(self.collect_params().values())
    if _applies(self) is None:
        _CHECKED[self] = _state()


def _accumulating(params):
    """The names of the Parameters ``params`` whose gradients accumulate (grad_req 'add')."""
    return frozenset(p.name for p in params if p.grad_req == 'add')


def _state():   # changes with every convert and every Parameter mxmp stores low
    return _EPOCH[0], len(STORED_FROM)


def _inside(block):
    """(converted blocks inside ``block``, their Conversion): :mod:`mxmp._src.block_scope`;
    with none, reading Parameters mxmp stores low is refused (:mod:`.param_dtypes`)."""
    from .block_scope import converted_inside
    inside, conversion = converted_inside(block, _CONVERTED)
    if conversion is None and STORED_FROM and not isinstance(block, gluon.SymbolBlock):
        _param_dtypes().check_unconverted(block, block.collect_params().values())
    return inside, conversion


def _call_cached_op(self, *args):
    if _CONSUMED or _FROZEN:
        check_frozen(self)
    if self._cached_op is not None and _CHECKED.get(self) != _state() and \
            _applies(self) is None:   # a graph built before a convert: checked again
        _CHECKED[self] = _state()
        if _inside(self)[0]:
            self._clear_cached_op()   # rebuilt with the converted blocks' nodes planned
    # the Parameters kept at the build, not collect_params() (a walk of the block) per call
    accumulating = _ACCUMULATING.get(self)
    if self._cached_op is not None and accumulating is not None and \
            accumulating[1] != _accumulating(accumulating[0]):
        self._clear_cached_op()   # grad_req changed since the graph was built: guard anew
    if self._cached_op is None and _applies(self) is not None:
        _LOCAL.inference_call = not autograd.is_recording()
        try:
            self._build_cache(*args)
        finally:
            _LOCAL.inference_call = False
    built = _BUILT.get(self)
    if built is None or not self._cached_graph or \
            built.symbol is not self._cached_graph[1] and not self._backend:
        return _ORIGINAL['_call_cached_op'](self, *args)
    flat = [a for a in _flatten(args, 'input')[0] if a is not None]
    ctx = flat[0].context
    recording = autograd.is_recording()
    built.before_call(ctx, recording)
    if recording:
        _reset_fused()  # a training step follows: fused state goes stale
    elif not self._backend and built.fuses(ctx):
        out = built.fused(*flat)
        if out is not None:
            return _regroup(list(out) if isinstance(out, (list, tuple)) else [out],
                            self._out_format)
    return _ORIGINAL['_call_cached_op'](self, *args)


def _forward(self, x, *args):
    if self._active or not isinstance(x, mx.nd.NDArray):
        return _ORIGINAL['forward'](self, x, *args)
    if self in _CONVERTED:
        raise RuntimeError('%s was converted by mxmp.convert but is not hybridized, so it would '
                           'run in float32: call %s.hybridize() first' % (self.name, self.name))
    if STORED_FROM:
        _param_dtypes().check_unconverted(self, self._reg_params.values())
    conversion = _GLOBAL[0]
    depth = getattr(_LOCAL, 'depth', 0)
    if conversion is not None and depth == 0 and type(self) not in _WARNED and \
            list(self.collect_params().keys()):   # blocks without weights (losses): silent
        _WARNED.add(type(self))
        warnings.warn(
            '%s (%s) runs imperatively, in float32: mxmp.amp.init applies to the graphs of '
            'hybridized blocks. Call net.hybridize() before running it to compute in %s.'
            % (self.name, type(self).__name__, conversion.policy.target_dtype), stacklevel=3)
    _LOCAL.depth = depth + 1
    try:
        return _ORIGINAL['forward'](self, x, *args)
    finally:
        _LOCAL.depth = depth


def _export(self, path, epoch=0, remove_amp_cast=None, library_ops=False):
    if self in _FROZEN:   # its casts and stored dtypes are its graph (mxmp.freeze)
        from .frozen_calls import export_frozen
        return export_frozen(self, path, epoch, remove_amp_cast, _ORIGINAL['export'], library_ops)
    remove_amp_cast = remove_amp_cast is not False   # None is MXNet's default: True
    built = _BUILT.get(self)
    if built is None or not self._cached_graph or built.symbol is not self._cached_graph[1]:
        return _ORIGINAL['export'](self, path, epoch, remove_amp_cast)
    from .block_export import export_converted   # lazily: import budget
    return export_converted(self, path, epoch, remove_amp_cast, library_ops, _ORIGINAL['export'])


def _routed(module, func, name):
    """MXNet's method ``name`` as ``module.func(self, MXNet's method, *args, **kwargs)``."""
    def wrapper(self, *args, **kwargs):
        routed = getattr(importlib.import_module(module, __package__), func)
        return routed(self, _ORIGINAL[name], *args, **kwargs)
    return wrapper


def _param_dtypes():   # loaded when first needed (import budget)
    from . import param_dtypes
    return param_dtypes


def _reset_fused():   # every fused inference graph: the parameters may change (rebuilt at use)
    for built in [b for b in _BUILT.values() if b.fused is not None]:
        built.fused.reset()


def _set_data(self, data):
    _reset_fused()
    value_changed(self)   # the Trainers' master weights follow the new value
    return _ORIGINAL['set_data'](self, data)


_WRAPPERS = {(gluon.HybridBlock, '_build_cache'): _build_cache,
             (gluon.HybridBlock, '_call_cached_op'): _call_cached_op,
             (gluon.HybridBlock, 'forward'): _forward, (gluon.HybridBlock, 'export'): _export,
             (gluon.Parameter, 'set_data'): _set_data}
_WRAPPERS.update({(cls, name): _routed(module, func, name)
                  for cls, name, module, func in (
                      (gluon.Block, 'save_parameters', '.block_params', 'save_parameters'),
                      (gluon.Block, 'load_parameters', '.block_params', 'load_parameters'),
                      (gluon.ParameterDict, 'save', '.block_params', 'save_param_dict'),
                      (gluon.ParameterDict, 'load', '.block_params', 'load_param_dict'),
                      (gluon.Parameter, 'initialize', '.param_dtypes', 'initialize'),
                      (gluon.ParameterDict, 'zero_grad', '.param_dtypes', 'zero_grad'))})


def install_hooks():
    """Replace MXNet's methods with mxmp's wrappers (module docstring); idempotent."""
    if _ORIGINAL:
        return
    for (cls, name), wrapper in _WRAPPERS.items():
        _ORIGINAL[name] = original = getattr(cls, name)   # the names are distinct
        wrapper.__doc__ = original.__doc__
        setattr(cls, name, wrapper)


def remove_hooks():
    """Undo what mxmp did to MXNet's objects: MXNet's methods back, the Parameters
    ``cast_params`` stored low in float32 again (the Trainer's master weights where kept,
    :mod:`mxmp._src.param_dtypes`), converted graphs dropped (the next is MXNet's float32
    one), every conversion and ``amp.init``'s switch forgotten (the next hooks again)."""
    _param_dtypes().restore_dtypes()
    for block in list(_BUILT.keys()) + list(_CONVERTED.keys()):
        block._clear_cached_op()
    for cls, name in _WRAPPERS if _ORIGINAL else ():
        setattr(cls, name, _ORIGINAL[name])
    for state in (_ORIGINAL, _CONVERTED, _BUILT, _ACCUMULATING, _FROZEN, _CONSUMED, _CHECKED,
                  PARAM_POLICY):
        state.clear()
    _GLOBAL[0] = None


def attach_trainer_loss_scaler(trainer, loss_scaler):
    """contrib.amp's hook on a ``gluon.Trainer``, the one mxmp stamps: ``trainer._amp_loss_scaler
    = loss_scaler`` (``gluon.Trainer._update`` in MXNet 1.9.1 asks its ``has_overflow(params)``
    before every update and skips the update on True) and ``trainer._amp_original_scale =
    trainer._scale`` (its ``rescale_grad``). These are the attributes contrib.amp 1.9.1's
    ``init_trainer`` sets and its users read (docs/from_contrib_amp.md)."""
    trainer._amp_loss_scaler = loss_scaler
    trainer._amp_original_scale = trainer._scale
