"""The oneDNN-fused inference twin of a converted block (:class:`FusedInference`), which
:class:`mxmp._src.gluon_graph.BuiltGraph` holds, and the checks of a fused graph.

Fusion (MXNet 1.9.1's ``'MKLDNN'`` subgraph backend) is inference-only. MXNet folds a
BatchNorm into a bfloat16 convolution by truncation, so the twin's graph has its BatchNorms
folded in float32 first (:mod:`mxmp._src.graph.fold`, ``fold_batchnorm``). Fused nodes keep
state between calls, so the twin is rebuilt when a parameter array was replaced or the hook
module calls :meth:`FusedInference.reset` (training calls, ``Parameter.set_data``). The twin
runs the ``cast_params=True`` graph, fed with target-dtype copies of float32 weights and with
the folded weights. At each build, the nodes it computes from weights alone become variables
holding their values (:mod:`mxmp._src.graph.constants`, as :func:`mxmp.freeze` does): GluonNLP's
attention cells reshape and concatenate their query, key and value weights and biases on every
call. Measurements: docs/pass.md, docs/benchmark.md "Fused inference".
"""
import logging

import mxnet as mx
from mxnet import autograd, gluon

from .dtypes import dtype_name
from .graph.symbol_json import load

__all__ = ['BACKEND', 'count_fused', 'unsafe_outputs', 'FusedInference', 'fold_weight_nodes',
           'adopt_array']

logger = logging.getLogger('mxmp.gluon')


#: MXNet's oneDNN subgraph backend.
BACKEND = 'MKLDNN'


def count_fused(sym):
    """Number of fused oneDNN nodes (ops named ``_sg_mkldnn_*``) in ``sym`` (mxnet.sym.Symbol)."""
    return sum(1 for n in load(sym)['nodes'] if n['op'].startswith('_sg_mkldnn_'))


def unsafe_outputs(sym):
    """Names of ``sym``'s outputs that another node also consumes (list of str): MXNet 1.9.1's
    fusion can return a wrong value for them (docs/pass.md), so such graphs are not fused."""
    nodes = load(sym)
    consumed = {(i[0], i[1]) for n in nodes['nodes'] for i in n.get('inputs', [])}
    return [nodes['nodes'][h[0]]['name'] for h in nodes['heads']
            if (h[0], h[1]) in consumed and nodes['nodes'][h[0]]['op'] != 'null']


class FusedInference:
    """The fused inference twin of a block: a ``SymbolBlock`` on its graph and Parameters,
    hybridized with ``backend='MKLDNN'`` and the block's flags; built at first use, rebuilt
    after :meth:`reset` or when a parameter array was replaced. If MXNet refuses the fusion it
    logs one line and :meth:`__call__` returns None from then on.

    Args:
        block (mxnet.gluon.HybridBlock): the block (its ``_cached_graph`` and ``_flags``).
        precast (callable or None): ``precast(args)`` returns ``(symbol, names, dtype,
            folds)``: a graph taking the weights ``names`` as ``dtype`` arrays, run with cast
            copies, and the :class:`~mxmp._src.graph.fold.Fold` s whose new variables it reads
            (computed in float32 from the Parameters at each build).
    """

    def __init__(self, block, precast=None):
        self.block = block
        self.precast = precast
        self.twin = None
        self.refused = None  # the reason, once fusion was refused
        self._key = None   # the parameters' arrays the twin was built on
        self._precast = None  # precast()'s result, computed once
        self._params = list(block.collect_params().values())

    def reset(self):
        """Drop the fused graph (rebuilt on the next call)."""
        self.twin = None
        self._key = None

    @property
    def symbol(self):
        """The fused Symbol, or None before the first fused call (or after a refusal)."""
        return self.twin._cached_graph[1] if self.twin is not None and \
            self.twin._cached_op is not None else None

    def _arrays(self):
        return [p._data[0] if p._data else None for p in self._params]

    def __call__(self, *args):
        """Run the fused graph on NDArrays; None when fusion was refused (use the unfused one)."""
        if self.refused is not None:
            return None
        if self.twin is not None and all(a is b for a, b in zip(self._arrays(), self._key)):
            return self.twin(*args)   # built on the arrays the parameters hold now
        unsafe = unsafe_outputs(self.block._cached_graph[1])
        self.reset()  # the old fused graph's memory can go before the new one is made
        if unsafe:
            self.refused = ('output %s also feeds another node, where MXNet\'s fusion can '
                            'return a wrong value' % ', '.join(unsafe))
        else:
            try:
                twin = self._build(args)
                out = twin(*args)
                for o in (out if isinstance(out, (list, tuple)) else [out]):
                    o.wait_to_read()  # a refusal surfaces here, not later and far from the cause
                if count_fused(twin._cached_graph[1]) == 0:
                    self.refused = 'no fusible pattern in the graph'
            except Exception as err:  # pylint: disable=broad-except  (logged, then unfused)
                self.refused = '%s: %s' % (type(err).__name__, str(err).strip().splitlines()[0]
                                           if str(err).strip() else '')
        if self.refused is not None:
            logger.warning('%s: oneDNN fusion refused (%s); inference runs the unfused graph',
                           self.block.name, self.refused)
            self.reset()
            return None
        self.twin, self._key = twin, self._arrays()  # after _build: deferred init done
        return out

    def _build(self, args):
        inputs, sym = self.block._cached_graph
        # typed inputs: the SymbolBlock infers its Parameters' dtypes from them
        inputs = [mx.sym.var(s.name, dtype=a.dtype) for s, a in zip(inputs, args)]
        params = self.block.collect_params()
        if self.precast is not None:
            if any(p._deferred_init for p in self._params):
                # Shapes come from the first batch (as the block's own first call would do).
                self.block._deferred_infer_shape(*args)
                for p in self._params:
                    p._finish_deferred_init()
            if self._precast is None:
                self._precast = self.precast(args)
            sym, names, dtype, folds = self._precast
            params = _twin_params(params, names, dtype, folds)
        sym, params = fold_weight_nodes(sym, params, args[0].context)
        twin = gluon.SymbolBlock(sym, inputs, params=params)
        twin.hybridize(backend=BACKEND, **dict(self.block._flags))
        return twin


def _twin_params(shared, names, dtype, folds):
    """The fused twin's ParameterDict: the block's Parameters (``shared``), replaced by
    ``dtype`` copies for the variables ``names`` not stored in it, plus the folded variables of
    ``folds`` (float32 from the Parameters, then ``dtype`` if in ``names``); the copies take
    no gradient."""
    from .graph.fold import folded_values   # loaded at the first fused graph only
    params, values = gluon.ParameterDict(), {}
    # MXNet's CPU BatchNorm writes its moving statistics in the backward pass without the
    # engine ordering later reads of them after that write: asnumpy() read the values of the
    # step before (measured); only waitall() waits for it.
    mx.nd.waitall()
    with autograd.pause():
        for name, param in shared.items():
            values[name] = param.data(param.list_ctx()[0]), param.list_ctx()
        for fold in folds:
            ctxs = values[fold.weight][1]
            weight, bias = folded_values(fold, lambda n: values[n][0])
            values[fold.new_weight], values[fold.new_bias] = (weight, ctxs), (bias, ctxs)
        for name, (value, ctxs) in values.items():
            target = dtype if name in names else value.dtype
            if name in shared.keys() and dtype_name(value.dtype) == dtype_name(target):
                params._params[name] = shared[name]   # float32 or already stored in dtype
                continue
            copy = gluon.Parameter(name, shape=value.shape, dtype=target, grad_req='null')
            copy._init_impl(mx.nd.amp_cast(value, dtype=target), ctxs)
            params._params[name] = copy
    return params


def fold_weight_nodes(sym, params, ctx, release=None):
    """``sym`` with the nodes computed from its Parameters alone folded into variables
    (:func:`mxmp._src.graph.constants.fold_constants`, their values computed now on ``ctx``;
    the variables ``params`` lacks are data), and the ParameterDict of the folded graph:
    ``params``'s entries it still reads and one Parameter (no gradient) holding each new value.

    Args:
        sym (mxnet.sym.Symbol): an inference-only graph.
        params (gluon.ParameterDict): a value for each of its weights.
        ctx (mxnet.Context): where the values are computed and kept.
        release (callable or None): ``release(name)`` as soon as no fold needs Parameter
            ``name``'s array any more (:func:`mxmp.freeze` frees it there); None keeps them.
    """
    from .graph.constants import fold_constants   # loaded at the first fused graph only
    wanted = set(sym.list_arguments()) | set(sym.list_auxiliary_states())
    names = set(params.keys())
    arrays = {n: params[n].data(ctx) for n in wanted & names}

    def drop(name):
        del arrays[name]
        if release is not None:
            release(name)

    with autograd.pause():
        sym, added = fold_constants(sym, wanted - names, arrays, ctx, drop)
    if not added:
        return sym, params
    kept = set(sym.list_arguments()) | set(sym.list_auxiliary_states())
    out = gluon.ParameterDict()
    for name in params.keys():
        if name in kept:
            out._params[name] = params[name]
    for name, value in added.items():
        adopt_array(out, name, value, ctx)
    return sym, out


def adopt_array(out, name, array, ctx):
    """A Parameter ``name`` in ``out`` (a ParameterDict) holding ``array`` itself (no copy) on
    ``ctx``, without gradient."""
    param = gluon.Parameter(name, shape=array.shape, dtype=array.dtype, grad_req='null')
    param._ctx_list = [ctx]
    param._ctx_map = [[], []]
    dev = param._ctx_map[ctx.device_typeid & 1]
    dev.extend([None] * (ctx.device_id + 1 - len(dev)))
    dev[ctx.device_id] = 0
    param._data = [array]
    param._grad = None
    out._params[name] = param
