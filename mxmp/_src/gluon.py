"""Mixed precision inside the user's own Gluon network: :func:`convert` and the process-wide
switch of :func:`mxmp.amp.init`.

**The one module of mxmp that hooks MXNet.** :func:`install_hooks` (run by the first mxmp.Trainer,
:func:`convert` or ``amp.init``; ``import mxmp`` patches nothing) replaces these methods with
wrappers that call the originals: ``HybridBlock._build_cache`` (the traced graph of a converted
block goes through the pass, :func:`mxmp._src.gluon_graph.rewrite`), ``_call_cached_op``
(grouped weights back to the default layout; the fused inference twin; calls :func:`mxmp.freeze`
forbids), ``forward`` (a converted block that is not hybridized raises; under ``amp.init`` an
imperative call warns once), ``export``/``save_parameters``/``load_parameters`` (files plain
MXNet loads: float32, a frozen block's as it runs), and ``Parameter.set_data`` (fused graphs are
rebuilt). :func:`remove_hooks` puts MXNet's methods back and forgets every conversion. Which
blocks are converted is kept here, in weak dictionaries keyed by the block or Parameter: nothing
is stamped on MXNet's objects but contrib.amp's own hook on a ``gluon.Trainer``
(:func:`attach_trainer_loss_scaler`, for :mod:`mxmp.amp`).
"""
import logging
import threading
import warnings
import weakref

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon.block import _flatten, _regroup

from .graph.convert import convert_symbol
from .graph.strip import float32_arrays, remove_casts
from .graph.stem import check_option as check_pad_stem
from .gluon_graph import (PARAM_POLICY, Conversion, cast_deferred, cast_to_graph, rewrite,
                          unrounded_values, value_changed)
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
_ORIGINAL = {}                             # method name -> MXNet's function
_LOCAL = threading.local()                 # depth (amp.init's warning), inference_call
_WARNED = set()


def converted_graph(block):
    """The mixed-precision Symbol a converted, hybridized ``block`` runs (casts included).

    Raises:
        RuntimeError: no graph built since the last cache clear, or the block is not converted.
    """
    built = _BUILT.get(block)
    if built is None or not block._cached_graph:
        raise RuntimeError('%s has no mixed-precision graph yet: convert it (mxmp.convert or '
                           'mxmp.amp.init), hybridize it and call it once' % block.name)
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
        from .block_tree import hybrid_parts   # a plain Block: convert the graphs inside it
        parts = hybrid_parts(block) if isinstance(block, gluon.Block) else []
        if not parts:
            raise TypeError('mxmp.convert needs a gluon.HybridBlock (or a Block holding some), '
                            'got %s with none inside: write it as a HybridBlock with '
                            'hybrid_forward(self, F, x)' % type(block).__name__)
        logger.info('mxmp.convert: %s is a plain Block; converting its HybridBlocks %s (its '
                    'own forward runs as written)', block.name, [p.name for p in parts])
        for part in parts:
            convert(part, target_dtype, cast_params, emulate, policy, fuse_inference, pad_stem,
                    fold_batchnorm)
        return block
    if fuse_inference not in ('auto', True, False):
        raise ValueError("fuse_inference=%r: use 'auto', True or False" % (fuse_inference,))
    check_pad_stem(pad_stem)
    if fold_batchnorm not in (True, False):
        raise ValueError('fold_batchnorm=%r: use True or False' % (fold_batchnorm,))
    policy = resolve_policy(policy, target_dtype, cast_params, emulate)
    conversion = Conversion(policy, fuse_inference, pad_stem, bool(fold_batchnorm))
    previous = _CONVERTED.get(block)
    if previous is not None:
        if previous == conversion:
            return block
        raise ValueError(
            '%s is already converted by mxmp (target dtype %s); converting it again with other '
            'settings would mix two policies. Build the network anew (or load its float32 '
            'checkpoint into a new one) and convert that.'
            % (block.name, previous.policy.target_dtype))
    install_hooks()
    def register(child):   # the block and every HybridBlock inside it (Block.apply)
        if isinstance(child, gluon.HybridBlock):
            _CONVERTED[child] = conversion
            child._clear_cached_op()
    block.apply(register)
    for param in block.collect_params().values():
        PARAM_POLICY[param] = policy
    if isinstance(block, gluon.SymbolBlock):
        # Its graph is fixed: convert it now (Parameters stored in the target dtype are cast
        # now too), on the context of its Parameters.
        ctxs = [c for p in block.collect_params().values() if p._ctx_list for c in p._ctx_list]
        _convert_graph(block, conversion, (), ctxs[0] if ctxs else None)
    elif policy.cast_params:
        _cast_params_now(block, policy)
    if not block._active:
        logger.info('mxmp.convert: hybridizing %s (mixed precision runs in its graph)', block.name)
        block.hybridize()
    return block


def _cast_params_now(block, policy):
    """Store the weights ``policy`` stores in low precision now, found on ``block`` traced with
    one input ``data`` (else at its first graph), so that what runs before the first call sees
    their final dtypes."""
    try:
        out = block(mx.sym.var('data'))
        sym = mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
        converted = convert_symbol(sym, policy=policy)
    except Exception:  # pylint: disable=broad-except  (other inputs: cast at the first call)
        return
    cast_to_graph(block.collect_params(), converted)


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


def _convert_graph(block, conversion, args, ctx=None, keep_unrounded=True):
    """Rewrite ``block``'s cached graph with the pass unless it is already the converted one
    (``keep_unrounded``: see :func:`mxmp._src.gluon_graph.cast_to_graph`)."""
    inputs, sym = block._get_graph(*args)
    built = _BUILT.get(block)
    if built is not None and built.symbol is sym:
        return
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
    conversion = _applies(self)
    # only a build by an inference call drops the master values (BuiltGraph.before_call)
    keep = not getattr(_LOCAL, 'inference_call', False)
    if conversion is not None:
        _convert_graph(self, conversion, args, keep_unrounded=keep)
    _ORIGINAL['_build_cache'](self, *args)
    if conversion is not None:
        cast_deferred(self.collect_params().values())


def _accumulating(params):
    """The names of the Parameters ``params`` whose gradients accumulate (grad_req 'add')."""
    return frozenset(p.name for p in params if p.grad_req == 'add')


def _call_cached_op(self, *args):
    if _CONSUMED or _FROZEN:
        check_frozen(self)
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


def _export(self, path, epoch=0, remove_amp_cast=None):   # None: MXNet's default, True
    if self in _FROZEN:   # its casts and stored dtypes are its graph (mxmp.freeze)
        from .frozen_calls import export_frozen
        return export_frozen(self, path, epoch, remove_amp_cast, _ORIGINAL['export'])
    remove_amp_cast = True if remove_amp_cast is None else remove_amp_cast
    built = _BUILT.get(self)
    if built is None or not self._cached_graph or built.symbol is not self._cached_graph[1]:
        return _ORIGINAL['export'](self, path, epoch, remove_amp_cast)
    _ORIGINAL['export'](self, path, epoch, remove_amp_cast=False)
    if remove_amp_cast:
        remove_casts(self._cached_graph[1]).save('%s-symbol.json' % path)
        params_file = '%s-%04d.params' % (path, epoch)
        mx.nd.save(params_file, float32_arrays(mx.nd.load(params_file)))


def _save_parameters(self, filename, deduplicate=False, dtype='float32'):
    if self not in _CONVERTED:
        return _ORIGINAL['save_parameters'](self, filename, deduplicate)
    from .block_params import save_block_parameters   # lazily: import budget
    return save_block_parameters(self, filename, deduplicate=deduplicate, dtype=dtype)


def _load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False,
                     cast_dtype=False, dtype_source='current'):
    if self not in _CONVERTED:
        return _ORIGINAL['load_parameters'](self, filename, ctx, allow_missing, ignore_extra,
                                            cast_dtype, dtype_source)
    from .block_params import load_block_parameters
    return load_block_parameters(self, filename, ctx=ctx, allow_missing=allow_missing,
                                 ignore_extra=ignore_extra, cast_dtype=cast_dtype,
                                 dtype_source=dtype_source)


def _reset_fused():
    """Drop every fused inference graph: the parameters may change (rebuilt at next use)."""
    for built in [b for b in _BUILT.values() if b.fused is not None]:
        built.fused.reset()


def _set_data(self, data):
    _reset_fused()
    value_changed(self)   # the Trainers' master weights follow the new value
    return _ORIGINAL['Parameter.set_data'](self, data)


_WRAPPERS = {'_build_cache': _build_cache, '_call_cached_op': _call_cached_op, 'forward': _forward,
             'export': _export, 'save_parameters': _save_parameters,
             'load_parameters': _load_parameters}


def install_hooks():
    """Replace MXNet's methods with mxmp's wrappers (module docstring); idempotent."""
    if _ORIGINAL:
        return
    for name, wrapper in _WRAPPERS.items():
        _ORIGINAL[name] = getattr(gluon.HybridBlock, name)
        wrapper.__doc__ = _ORIGINAL[name].__doc__
        setattr(gluon.HybridBlock, name, wrapper)
    _ORIGINAL['Parameter.set_data'] = gluon.Parameter.set_data
    gluon.Parameter.set_data = _set_data


def remove_hooks():
    """Undo mxmp's hooks: put MXNet's ``HybridBlock`` and ``Parameter.set_data`` methods back
    and forget every conversion and ``amp.init``'s switch. Graphs already built run until
    their block's cache is cleared (``hybridize()``); the next graph is MXNet's, float32.
    The next :func:`convert`, ``amp.init`` or mxmp.Trainer step installs the hooks again."""
    for name, original in _ORIGINAL.items():
        if name == 'Parameter.set_data':
            gluon.Parameter.set_data = original
        elif name in ('save_parameters', 'load_parameters'):
            delattr(gluon.HybridBlock, name)   # inherited from gluon.Block
        else:
            setattr(gluon.HybridBlock, name, original)
    for state in (_ORIGINAL, _CONVERTED, _BUILT, _ACCUMULATING, _FROZEN, _CONSUMED, PARAM_POLICY):
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
