"""The work done when Gluon builds or runs a converted network's graph (no hook of its own:
:mod:`mxmp._src.gluon` calls it): :class:`Conversion` (the settings), :func:`rewrite` (the pass
on a traced graph), :class:`BuiltGraph` (per-call state, with its oneDNN-fused inference twin,
:class:`mxmp._src.fused_inference.FusedInference`), and the Parameters' dtype bookkeeping.
"""
import dataclasses
import functools
import logging
import os
import weakref
from typing import Union

import mxnet as mx
from mxnet import autograd
from mxnet.gluon.block import _flatten

from .device import lp_kernels_available, to_default_layout
from .dtypes import dtype_name, from_mshadow_enum, mx_dtype
from .graph.convert import convert_symbol
from .graph.strip import count_casts
from .graph.stem import check_option as check_pad_stem, pad_stem as pad_stem_of, \
    padded_convolutions, wants_padding
from .graph.symbol_json import CAST_OPS, cast_param_names, dump, load
from .policy.policy import Policy

__all__ = ['Conversion', 'rewrite', 'build_in_walk_order', 'cast_to_graph', 'BuiltGraph',
           'unrounded_values', 'STORED_FROM', 'value_changed', 'value_generation']

logger = logging.getLogger('mxmp.gluon')

# Parameter -> its float32 arrays from before cast_params rounded it to the target dtype
# (one per device). mxmp.Trainer makes the master weights from these, not from the rounded
# values (unrounded_values). Keyed by the Parameter object itself, weakly.
_UNROUNDED = weakref.WeakKeyDictionary()


#: Parameter -> the Policy of the converted network it belongs to; written by
#: :func:`mxmp.convert` and ``amp.init``'s graphs (:mod:`mxmp._src.gluon`), read through
#: :func:`policy_of`. Weak keys: nothing is stamped on the Parameters.
PARAM_POLICY = weakref.WeakKeyDictionary()


def policy_of(param):
    """The :class:`mxmp.Policy` of the converted network ``param`` (a Parameter) belongs to, or
    None; the Trainers read their defaults (loss scaler, target dtype) from it."""
    return PARAM_POLICY.get(param)


@dataclasses.dataclass(frozen=True)
class Conversion:
    """How a network is converted (:func:`mxmp.convert` describes each field).

    Attributes:
        policy (mxmp.Policy): every precision setting (``emulate`` may be ``'auto'``).
        fuse_inference ('auto' or bool): oneDNN-fused graph for inference calls on a CPU.
        pad_stem ('auto' or bool): pad an odd-channel NCHW stem by one zero channel.
        fold_batchnorm (bool): the fused graph's BatchNorms folded in float32 by mxmp.
    """
    policy: Policy
    fuse_inference: Union[str, bool] = 'auto'
    pad_stem: Union[str, bool] = 'auto'
    fold_batchnorm: bool = True

    def __post_init__(self):   # ValueError naming the accepted values
        if self.fuse_inference not in ('auto', True, False):
            raise ValueError("fuse_inference=%r: use 'auto', True or False"
                             % (self.fuse_inference,))
        check_pad_stem(self.pad_stem)
        if self.fold_batchnorm not in (True, False):
            raise ValueError('fold_batchnorm=%r: use True or False' % (self.fold_batchnorm,))


def rewrite(block, conversion, inputs, sym, args, ctx=None, keep_unrounded=True):
    """The :class:`BuiltGraph` of ``block`` (a HybridBlock) for the float32 graph ``sym`` MXNet
    just traced with data variables ``inputs``, called with ``args`` (NDArrays, nested, None for
    absent ones; empty for a SymbolBlock converted before its first call) on ``ctx`` (default:
    the inputs' context). Parameters get the dtypes the converted graph declares (cast now;
    ``keep_unrounded``: as in :func:`cast_to_graph`).
    """
    flat = [a for a in _flatten(args, 'input')[0] if a is not None]
    if flat:
        _finish_deferred_init(block, sym, args)
    ctx = ctx or next((a.context for a in flat if isinstance(a, mx.nd.NDArray)),
                      mx.current_context())
    policy = conversion.policy.on(ctx)
    names = tuple(s.name for s in inputs)
    dtypes = {s.name: from_mshadow_enum(s.attr('__dtype__'))
              for s in inputs if s.attr('__dtype__')}
    dtypes.update({n: a.dtype for n, a in zip(names, flat) if isinstance(a, mx.nd.NDArray)})
    shapes = {n: a.shape for n, a in zip(names, flat) if isinstance(a, mx.nd.NDArray)}
    converted = convert_symbol(sym, policy=policy, data_dtypes=dtypes, data_names=names)
    if shapes and wants_padding(conversion.pad_stem, policy, ctx):
        converted = pad_stem_of(converted, shapes)
    params = block.collect_params()
    lp_names = cast_param_names(converted)
    cast_to_graph(params, converted, keep_unrounded)
    logger.info('mxmp: %s graph in %s%s: %d casts, %d parameters stored in %s', block.name,
                policy.target_dtype, ' (emulated)' if policy.emulate else '',
                count_casts(converted)['amp_cast'], len(lp_names), policy.target_dtype)
    precast = None
    if not policy.emulate and (conversion.fold_batchnorm or not policy.cast_params):
        # the fused twin takes low-precision weights, folded ones included
        precast = functools.partial(_precast_graph, sym, policy, dtypes, names, converted,
                                    conversion.fold_batchnorm)
    return BuiltGraph(block, conversion.fuse_inference, policy, converted, precast,
                      [params[n] for n in lp_names if n in params])


def _finish_deferred_init(block, sym, args):
    """Initialize ``block``'s deferred Parameters as MXNet's ``_build_cache`` would for the
    float32 graph ``sym``: shapes from ``args``, Parameters in ``sym``'s input order. The
    converted graph lists its inputs in another order (:mod:`.graph.grad_order`) and the
    initializers' random draws follow the order: a seed gives the float32 network's weights."""
    params = block.collect_params()
    names = [n for n in sym.list_inputs() if n in params.keys()]
    try:
        for name in names:
            params[name].data()
    except mx.gluon.parameter.DeferredInitializationError:
        block._deferred_infer_shape(*_flatten(args, 'input')[0])
        for name in names:
            params[name]._finish_deferred_init()


def build_in_walk_order(block, build, args):
    """Build the CachedOp of ``block`` (its converted graph in ``block._cached_graph``) with
    ``build`` (MXNet's ``HybridBlock._build_cache``, called with ``args``) on the graph in the
    gradient-order rule's walk order (:mod:`.graph.grad_order`: each weight cast's backward
    follows its layer's). ``block._cached_graph`` keeps the plain graph, which ``export``, the
    fused twin and ``mxmp.freeze`` read. A block with a subgraph backend (``hybridize(backend=)``,
    ``optimize_for``) is built on the plain graph: MXNet 1.9.1's partitioner refuses control
    dependencies (``CHECK_EQ(node->control_deps.size(), 0U)`` in ``build_subgraph.cc``)."""
    plain = block._cached_graph
    if not block._backend:
        from .graph.grad_order import substitute   # loaded by the first build only
        data_names = {s.name for s in plain[0]}
        block._cached_graph = plain[0], dump(substitute(load(plain[1]), data_names))
    try:
        build(block, *args)
    finally:
        block._cached_graph = plain


def cast_to_graph(params, converted, keep_unrounded=True):
    """Cast each Parameter of ``params`` (a ParameterDict) to the dtype the converted graph
    declares for its variable. ``keep_unrounded`` (bool, default True): keep the float32 values
    for the master weights (:func:`unrounded_values`); False (a cast made by an inference call,
    whose :meth:`BuiltGraph.before_call` would drop them next) frees each float32 array as soon
    as its cast is done, so the float32 and low-precision weights never all coexist."""
    for node in load(converted)['nodes']:
        declared = from_mshadow_enum(node.get('attrs', {}).get('__dtype__')) \
            if node['op'] == 'null' else None
        param = params[node['name']] if declared and node['name'] in params.keys() else None
        if param is not None and dtype_name(param.dtype) != declared:
            _cast_parameter(param, mx_dtype(declared), keep_unrounded)


def _precast_graph(float32_symbol, policy, data_dtypes, data_names, symbol, fold, args):
    """The fused twin's graph of ``symbol``: BatchNorms folded (``fold``), weights taken in
    the target dtype (module docstring), as :class:`FusedInference`'s ``precast``."""
    folds = []
    if fold:
        from .graph.fold import fold_batchnorm   # loaded at the first fused graph only
        float32_symbol, folds = fold_batchnorm(float32_symbol)
    graph = convert_symbol(float32_symbol, policy=policy, data_dtypes=data_dtypes,
                           cast_params=True, data_names=data_names)
    from .graph.kernel_undo import inference_only   # not loaded by `import mxmp`
    graph = dump(inference_only(load(graph)))   # it only ever runs inference
    if padded_convolutions(symbol):
        graph = pad_stem_of(graph, {n: a.shape for n, a in zip(data_names, args)})
    return graph, cast_param_names(graph), mx_dtype(policy.target_dtype), folds


class BuiltGraph:
    """One graph MXNet built for a converted block, and what each call of it needs.

    Attributes:
        symbol (Symbol): the converted graph (what the block's CachedOp runs).
        policy (mxmp.Policy): the policy it was converted with (emulation decided).
        fused (FusedInference or None): the oneDNN-fused inference twin (built at first use).
    """

    def __init__(self, block, fuse_inference, policy, symbol, precast, unrounded):
        self.fuse_inference = fuse_inference
        self.policy = policy
        self.symbol = symbol
        grouped = _grouped_weights_cast_in_graph(symbol)
        self._grouped = [p for n, p in block.collect_params().items() if n in grouped]
        self.unrounded = unrounded   # Parameters whose float32 values _UNROUNDED may hold
        if fuse_inference is not False:
            from .fused_inference import FusedInference   # lazily: import budget
        self.fused = None if fuse_inference is False else FusedInference(block, precast)

    def fuses(self, ctx):
        """bool: whether an inference call on ``ctx`` runs the fused graph."""
        option = self.fuse_inference
        if self.fused is None or autograd.is_training() or ctx.device_type != 'cpu':
            return False
        if option == 'auto':
            # MXNET_SUBGRAPH_BACKEND=NONE turns MXNet's own fusion off: 'auto' follows it.
            return not self.policy.emulate and \
                os.environ.get('MXNET_SUBGRAPH_BACKEND', '').upper() != 'NONE' and \
                lp_kernels_available(self.policy.target_dtype, ctx)
        return bool(option)

    def before_call(self, ctx, recording):
        """Before each call on ``ctx``: grouped weights back to the default layout; the first
        call outside ``autograd.record()`` drops the float32 values kept for master weights."""
        if not recording and self.unrounded:
            for param in self.unrounded:
                _UNROUNDED.pop(param, None)
            self.unrounded = []
        # A float32 inference forward may have left a weight in oneDNN's blocked layout.
        arrays = []
        for param in self._grouped:
            if param._data is not None:
                try:
                    arrays.append(param.data(ctx))
                except RuntimeError:
                    pass
        to_default_layout(arrays)


def _grouped_weights_cast_in_graph(sym):
    """Names of the variables the graph casts into the weight of a grouped Convolution or
    Deconvolution: the only casts oneDNN's blocked layout breaks (docs/pass.md)."""
    nodes = load(sym)['nodes']
    casts = {nid: {i for i, _, _ in n['inputs'] if nodes[i]['op'] == 'null'}
             for nid, n in enumerate(nodes) if n['op'] in CAST_OPS}
    names = set()
    for n in nodes:
        if n['op'] in ('Convolution', 'Deconvolution') and \
                int(n.get('attrs', {}).get('num_group', '1')) > 1 and len(n['inputs']) > 1:
            names.update(nodes[i]['name'] for i in casts.get(n['inputs'][1][0], ()))
    return names


# Parameter -> how many times its value was set from outside a Trainer (value_changed).
_GENERATION = weakref.WeakKeyDictionary()


def value_changed(param):
    """Record that ``param``'s value was set from outside (``Parameter.set_data``, which
    ``load_parameters`` calls, runs this through mxmp's hook): the Trainers make its float32
    master weights again from the new value at the next update, as a ``gluon.Trainer``
    updates the new value (:mod:`mxmp._src.training.master_weights`)."""
    _GENERATION[param] = _GENERATION.get(param, 0) + 1


def value_generation(param):
    """int: how many times :func:`value_changed` was told about ``param``."""
    return _GENERATION.get(param, 0)


def unrounded_values(param):
    """The float32 arrays (one per device) ``param`` held before ``cast_params`` rounded it,
    taken once (the Trainers' master weights start from them); None once taken, after the
    network's first inference call, or when the Parameter's value changed since."""
    arrays = _UNROUNDED.pop(param, None)
    if arrays is None or param._data is None or len(arrays) != len(param._data):
        return None
    with autograd.pause():
        for f32, current in zip(arrays, param._data):
            rounded = mx.nd.amp_cast(f32, dtype=current.dtype)
            if (mx.nd.amp_cast(rounded, dtype='float32') !=
                    mx.nd.amp_cast(current, dtype='float32')).sum().asscalar() != 0:
                return None
    return arrays


def _cast_parameter(param, dtype, keep_unrounded=True):
    """``Parameter.cast`` with ``amp_cast`` (round to nearest even; docs/pass.md); float32
    arrays are kept for :func:`unrounded_values` if ``keep_unrounded``. Deferred Parameters are
    cast once MXNet has initialized them in float32 (:func:`cast_deferred`). The casts are
    waited for, so that the engine frees the float32 arrays no longer referenced before the
    next Parameter is cast: casting a network never holds all its float32 and low-precision
    weights and gradients at once (BERT-base: a 1.1 GB transient, docs/benchmark.md)."""
    if param._data is None:
        _DEFERRED_CASTS[param] = (dtype, keep_unrounded)
        return
    STORED_FROM.setdefault(param, param.dtype)
    param._dtype = dtype
    with autograd.pause():
        to_default_layout(param._data)  # amp_cast fails on grouped weights oneDNN reordered
        if keep_unrounded and dtype_name(param._data[0].dtype) == 'float32':
            _UNROUNDED[param] = list(param._data)
        param._data = [mx.nd.amp_cast(d, dtype=dtype) for d in param._data]
        if param._grad is not None:
            param._grad = [mx.nd.amp_cast(g, dtype=dtype) for g in param._grad]
            autograd.mark_variables(param._data, param._grad, param.grad_req)
        for array in param._data + (param._grad or []):
            array.wait_to_read()


_DEFERRED_CASTS = weakref.WeakKeyDictionary()   # Parameter -> (target dtype, keep_unrounded)
#: Parameter -> its dtype before mxmp first stored it in another one (what
#: :func:`mxmp.remove_hooks` gives back; :mod:`mxmp._src.param_dtypes`). Weak keys.
STORED_FROM = weakref.WeakKeyDictionary()


def cast_deferred(params):
    """Cast the Parameters among ``params`` whose cast waited for their initialization."""
    for param in params:
        deferred = _DEFERRED_CASTS.get(param)
        if deferred is not None and param._data is not None:
            del _DEFERRED_CASTS[param]
            _cast_parameter(param, *deferred)
