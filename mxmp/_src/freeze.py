"""Inference-only form of a converted network with one copy of each weight: :func:`freeze`.

A converted block keeps what training needs: gradient arrays (Gluon allocates them unless
``grad_req='null'``), the weights the unfused graph reads, and, for fused inference, the twin's
folded or cast copies beside them. :func:`freeze` builds, from the block's Parameters, a
``gluon.SymbolBlock`` on the graph inference runs (BatchNorm folded into its Convolution in
float32, the low-precision layers' weights stored in the target dtype, oneDNN fusion where
the conversion fuses) whose Parameters hold one array each and no gradient, and releases the
block's own arrays one at a time while it does so, so the float32 and the frozen weights never
all coexist. Measurements: docs/benchmark.md "An inference-only network: mxmp.freeze".
"""
import logging

import mxnet as mx
from mxnet import autograd, gluon

from .dtypes import dtype_name, mx_dtype
from .graph.convert import convert_symbol
from .graph.fold import fold_batchnorm, folded_values
from .graph.kernel_undo import inference_only
from .graph.stem import pad_stem, wants_padding
from .graph.strip import remove_casts
from .graph.symbol_json import cast_param_names, dump, load
from .fused_inference import BACKEND, adopt_array, count_fused, fold_weight_nodes, \
    unsafe_outputs

__all__ = ['freeze']

logger = logging.getLogger('mxmp.gluon')


def freeze(block, *inputs):
    """Turn a block converted by :func:`mxmp.convert` into an inference-only network holding
    one copy of each weight, as ``torch.jit.freeze`` does for TorchScript: returns a new
    ``mxnet.gluon.SymbolBlock``; the block's own arrays move into it.

    The returned block runs the graph the conversion runs for inference, with:

    - every BatchNorm that follows a Convolution folded into its weight and bias, in float32,
      rounded once to nearest even (with ``fold_batchnorm=True``, the default of
      :func:`mxmp.convert`; :mod:`mxmp._src.graph.fold`);
    - the weights of low-precision layers stored in the target dtype (as ``cast_params=True``
      stores them) and the others (BatchNorm, LayerNorm, embeddings) in float32;
    - every node computed from weights alone (GluonNLP's concatenation of the query, key and
      value weights and its cast, the stem padding, the operator library's input copies)
      computed once into a variable, unless its value is larger than its inputs
      (:mod:`mxmp._src.graph.constants`);
    - no gradient arrays (``grad_req='null'``) and no float32 master weights;
    - MXNet's oneDNN fusion (``hybridize(backend='MKLDNN')``) where the conversion's
      ``fuse_inference`` fuses (``'auto'``: on a CPU with the real low-precision kernels). A
      fused graph runs faster and oneDNN keeps its own copy of each fused weight in its
      blocked layout; with ``mxmp.convert(..., fuse_inference=False)`` the frozen graph is not
      fused and those copies do not exist (the least memory; docs/benchmark.md).

    It is hybridized with the block's own flags (``static_alloc``...; a later ``hybridize()``
    without ``backend='MKLDNN'`` drops the fusion) and called once on ``inputs`` before it is
    returned; if MXNet refuses the fusion, one warning is logged and the unfused frozen graph
    runs. Its outputs come as MXNet's SymbolBlock gives them (one array, or a flat list). The
    heap memory the released float32 arrays leave is given back to the system (glibc's
    ``malloc_trim``).

    **The block itself is consumed**: its gradients are dropped first (deferred Parameters
    never get any), then each Parameter is initialized if deferred and gives up its array as
    soon as the frozen copy is made, one at a time, so that the network never exists twice in
    memory (BERT-base: 418 MiB of float32 weights). Calling it afterwards raises RuntimeError.
    Save its float32 checkpoint first (``block.save_parameters``) if it will be trained again.

    Args:
        block (mxnet.gluon.HybridBlock): converted by :func:`mxmp.convert` (any settings;
            ``cast_params`` need not be True), initialized (deferred shapes allowed), not
            frozen before.
        *inputs (mxnet.nd.NDArray): one example batch, as the block is called (any batch
            size can run afterwards where the graph allows it; ``static_shape`` reuses the
            first shape's memory plan). Its dtypes and context are the frozen graph's.

    Returns:
        mxnet.gluon.SymbolBlock: the inference-only network. Its outputs are float32 (as the
        converted block's); calling it under ``autograd.record()`` or
        ``autograd.train_mode()`` raises RuntimeError naming the fix (it has no gradients
        and its BatchNorms are folded). ``export(path)`` writes its graph with the casts and
        the stored dtypes (they are the frozen graph; ``remove_amp_cast=True`` raises
        ValueError), which plain MXNet's ``SymbolBlock.imports`` runs; its weights are rounded
        and folded, so save the float32 checkpoint before freezing to keep one.

    Raises:
        TypeError: ``block`` is not a HybridBlock, or an input is not an NDArray.
        ValueError: ``block`` is not converted by :func:`mxmp.convert`, no input is given, or
            its Parameters live on several contexts.
        RuntimeError: ``block`` was frozen before (its arrays are gone), or a Parameter is
            neither initialized nor deferred.
    """
    from . import gluon as hooks   # the hook module keeps which blocks are frozen
    if not isinstance(block, gluon.HybridBlock):
        raise TypeError('mxmp.freeze needs a gluon.HybridBlock converted by mxmp.convert, got %s'
                        % type(block).__name__)
    conversion = hooks.conversion_of(block)
    if conversion is None:
        raise ValueError('%s is not converted: call mxmp.convert(%s, \'bfloat16\') (with the '
                         'settings inference should use) before mxmp.freeze'
                         % (block.name, block.name))
    if not inputs:
        raise ValueError('mxmp.freeze(%s, *inputs) needs one example batch of the inputs the '
                         'block is called with (their shapes, dtypes and context)' % block.name)
    bad = [type(a).__name__ for a in inputs if not isinstance(a, mx.nd.NDArray)]
    if bad:
        raise TypeError('mxmp.freeze: the example inputs must be NDArrays, got %s' % bad)
    hooks.check_frozen(block)   # consumed by an earlier freeze: raises
    params = block.collect_params()
    ctxs = {str(c) for p in params.values() if p._ctx_list for c in p._ctx_list}
    if len(ctxs) > 1:
        raise ValueError('mxmp.freeze: %s has Parameters on several contexts (%s); a frozen '
                         'network runs on one: load them on one context first'
                         % (block.name, ', '.join(sorted(ctxs))))
    for param in params.values():
        if param._data is None and not param._deferred_init:
            raise RuntimeError('mxmp.freeze: Parameter %s is not initialized: call '
                               '%s.initialize() (or load_parameters) first'
                               % (param.name, block.name))
        param.grad_req = 'null'   # drops the gradient arrays now
    ctx = inputs[0].context
    hooks.release_built(block)   # its graphs, fused twin and float32 master values
    graph, names, folds = _frozen_graph(block, conversion, inputs, ctx)
    data_names = input_names(block, inputs)
    if any(p._deferred_init for p in params.values()):
        block._deferred_infer_shape(*inputs)   # shapes only: arrays are made one at a time
    frozen_params = _move_parameters(params, graph, names, folds, conversion, ctx, data_names)
    graph, frozen_params = _fold_constants(graph, frozen_params, ctx)
    data = [mx.sym.var(n, dtype=a.dtype) for n, a in zip(data_names, inputs)]
    frozen = gluon.SymbolBlock(graph, data, params=frozen_params)
    hooks.mark_frozen(block, frozen)
    fuse = _fuses(conversion, graph, ctx)
    flags = dict(block._flags)
    flags.pop('backend', None)
    if fuse:
        frozen.hybridize(backend=BACKEND, **flags)
    else:
        frozen.hybridize(**flags)
    _return_freed_memory()   # the float32 arrays released: before the first call allocates
    with autograd.predict_mode():
        try:
            _wait(frozen(*inputs))
            if fuse and count_fused(frozen._cached_graph[1]) == 0:
                logger.info('%s: no fusible pattern in the frozen graph', block.name)
        except Exception as err:  # pylint: disable=broad-except  (logged, then unfused)
            if not fuse:
                raise
            logger.warning('%s: oneDNN fusion refused (%s); the frozen network runs unfused',
                           block.name, str(err).strip().splitlines()[0] if str(err) else err)
            frozen.hybridize(**flags)
            _wait(frozen(*inputs))
    _return_freed_memory()
    return frozen


def _return_freed_memory():
    """Give the heap memory of the released float32 arrays back to the system (glibc's
    ``malloc_trim``; elsewhere nothing): freed blocks between live ones otherwise stay in the
    resident set (BERT-base: 656 against 548 MiB once running, docs/benchmark.md)."""
    from .malloc_tuning import glibc   # on first use: import mxmp stays small
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


def input_names(block, inputs):
    """The names of ``block``'s data variables: a SymbolBlock's own, else those Gluon gives a
    traced block's inputs (``HybridBlock._get_graph``)."""
    if isinstance(block, gluon.SymbolBlock):
        return [v.name for v in block._cached_graph[0]]
    return ['data'] if len(inputs) == 1 else ['data%d' % i for i in range(len(inputs))]


def _wait(out):
    for o in (out if isinstance(out, (list, tuple)) else [out]):
        o.wait_to_read()


def _fuses(conversion, graph, ctx):
    """Whether the frozen graph is fused (as :meth:`BuiltGraph.fuses` decides for the twin)."""
    import os
    option = conversion.fuse_inference
    if option is False or ctx.device_type != 'cpu' or unsafe_outputs(graph):
        return False
    if option == 'auto':
        from .device import lp_kernels_available
        policy = conversion.policy.on(ctx)
        return not policy.emulate and \
            os.environ.get('MXNET_SUBGRAPH_BACKEND', '').upper() != 'NONE' and \
            lp_kernels_available(policy.target_dtype, ctx)
    return True


def _frozen_graph(block, conversion, inputs, ctx):
    """(Symbol, low-precision variable names, folds) of the inference graph: the block traced
    in float32 (predict mode), BatchNorms folded, converted with ``cast_params=True``."""
    names = input_names(block, inputs)
    if isinstance(block, gluon.SymbolBlock):
        # its fixed graph, which mxmp.convert rewrote in place: the float32 graph back
        sym = remove_casts(block._cached_graph[1])
    else:
        block._clear_cached_op()
        with autograd.predict_mode():
            out = block(*[mx.sym.var(n) for n in names])
        sym = mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
    policy = conversion.policy.on(ctx)
    folds = []
    if conversion.fold_batchnorm:
        sym, folds = fold_batchnorm(sym)
    dtypes = {n: a.dtype for n, a in zip(names, inputs)}
    graph = convert_symbol(sym, policy=policy, data_dtypes=dtypes, cast_params=True,
                           data_names=tuple(names))
    graph = dump(inference_only(load(graph)))
    if wants_padding(conversion.pad_stem, policy, ctx):
        graph = pad_stem(graph, {n: a.shape for n, a in zip(names, inputs)})
    return graph, cast_param_names(graph), folds


def _move_parameters(params, graph, lp_names, folds, conversion, ctx, data_names):
    """The frozen block's ParameterDict: one Parameter per variable of ``graph``, made from
    ``params`` (folded where ``folds`` say, cast to the target dtype where ``lp_names`` say),
    each source array released as soon as nothing left needs it."""
    dtype = mx_dtype(conversion.policy.target_dtype)
    wanted = (set(graph.list_arguments()) | set(graph.list_auxiliary_states())) - \
        set(data_names)
    by_fold = {f.new_weight: f for f in folds}
    users = {}   # source Parameter name -> frozen variables still to make from it
    for fold in folds:
        for src in (fold.weight, fold.bias, fold.gamma, fold.beta, fold.mean, fold.var):
            if src is not None:
                users.setdefault(src, set()).add(fold.new_weight)
    for name in wanted:
        if name in params.keys():
            users.setdefault(name, set()).add(name)
    out = gluon.ParameterDict()

    def value(name):
        param = params[name]
        if param._deferred_init:
            param._finish_deferred_init()
        return param.data(ctx)

    def release(src, made):
        users[src].discard(made)
        if not users[src]:
            param = params[src]
            param._data = None
            param._grad = None

    with autograd.pause():
        for fold in folds:
            if fold.new_weight not in wanted:
                continue
            weight, bias = folded_values(fold, value)
            adopt_array(out, fold.new_weight,
                        _cast(weight, dtype, fold.new_weight in lp_names), ctx)
            adopt_array(out, fold.new_bias, _cast(bias, dtype, fold.new_bias in lp_names), ctx)
            for src in (fold.weight, fold.bias, fold.gamma, fold.beta, fold.mean, fold.var):
                if src is not None:
                    release(src, fold.new_weight)
        for name in sorted(wanted - set(out.keys())):
            if name in by_fold or name not in params.keys():
                continue
            array = value(name)
            if name in lp_names and dtype_name(array.dtype) != dtype_name(dtype):
                array = _cast(array, dtype, True)
            adopt_array(out, name, array, ctx)
            release(name, name)
    missing = wanted - set(out.keys())
    if missing:
        raise RuntimeError('mxmp.freeze: no value for the graph variables %s' % sorted(missing))
    return out


def _fold_constants(graph, params, ctx):
    """``graph`` with the nodes computed from weights alone folded into variables
    (:func:`fold_weight_nodes`), and its ParameterDict: the new variables added, the Parameters
    the graph no longer reads dropped (their arrays freed as soon as no fold needs them)."""
    def release(name):
        params[name]._data = None

    return fold_weight_nodes(graph, params, ctx, release)


def _cast(array, dtype, cast):
    """``array`` cast to ``dtype`` (round to nearest even) if ``cast``, waited for, so that the
    engine frees what it replaces before the next one is made."""
    if cast:
        array = mx.nd.amp_cast(array, dtype=dtype)
    array.wait_to_read()
    return array
