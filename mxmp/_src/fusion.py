"""oneDNN graph fusion for inference: the fused twin of a converted block, and fused exports.

MXNet 1.9.1's subgraph backend ``'MKLDNN'`` (``Symbol.optimize_for('MKLDNN', ...)``, also
``hybridize(backend='MKLDNN')``) rewrites a graph for inference: Convolution + BatchNorm
(+ Activation, + the residual add) become one ``_sg_mkldnn_conv`` node, FullyConnected a
``_sg_mkldnn_fully_connected`` one. The fused nodes have no backward (the backend's properties
are ``inference_only``), so training keeps the unfused graph.

Numerics: a fused convolution folds BatchNorm into its weights (``w * gamma / sqrt(var + eps)``)
before it runs, so in bfloat16 the folded weight is rounded, not the convolution's output before
BatchNorm: results differ from the unfused graph (and from emulation, which is bit-identical to
the unfused real kernels) by bfloat16-sized amounts. Only the unfused graph is bit-identical to
emulation (pin ``MXNET_SUBGRAPH_BACKEND=NONE`` for executors, or ``fuse_inference=False``).

Stale state: a fused node keeps state between calls (docs/pass.md), so :class:`FusedInference`
rebuilds its graph when a parameter array was replaced and when the hook module
(:mod:`mxmp._src.gluon`) calls :meth:`FusedInference.reset`: after a forward under
``autograd.record()``, ``Parameter.set_data`` (so ``load_parameters``) and ``hybridize()``.

Weights cast in the graph: when a converted block keeps its weights in float32
(``cast_params=False``), each low-precision weight reaches its convolution through an
``amp_cast`` whose output is rewritten on every call, so a fused convolution re-initializes
(re-folds BatchNorm, reorders the weight) on every call: measured slower than the unfused graph
[avx512_bf16]. The fused graph of such a block is therefore the ``cast_params=True`` graph, fed
with target-dtype copies of those weights, made when the fused graph is (re)built. They cost
2 bytes per weight while the fused graph exists.
"""
import logging

from .graph.symbol_json import load

__all__ = ['BACKEND', 'fuse_symbol', 'count_fused', 'FusedInference']

logger = logging.getLogger(__name__)

#: MXNet's oneDNN subgraph backend.
BACKEND = 'MKLDNN'
#: Prefix of the op names of fused nodes.
FUSED_PREFIX = '_sg_mkldnn_'

def count_fused(sym):
    """Number of fused oneDNN nodes (ops named ``_sg_mkldnn_*``) in ``sym`` (mxnet.sym.Symbol)."""
    return sum(1 for n in load(sym)['nodes'] if n['op'].startswith(FUSED_PREFIX))


def fuse_symbol(sym, arg_params=None, aux_params=None, shapes=None, ctx=None):
    """``sym`` partitioned by oneDNN's fusion for inference (``sym.optimize_for('MKLDNN')``).

    Args:
        sym (mxnet.sym.Symbol): an inference graph (casts allowed).
        arg_params, aux_params (dict of str -> NDArray): its parameters (shapes and dtypes let
            the backend check the patterns; values are not baked in: folding happens at run
            time).
        shapes (dict of str -> tuple of int): shapes of the data inputs, e.g.
            ``{'data': (1, 3, 224, 224)}``. Without them MXNet cannot infer the graph's shapes
            and fuses nothing (measured); the fused graph then runs any batch size.
        ctx (mxnet.Context): default ``mx.cpu()``; the backend is CPU-only.

    Returns:
        mxnet.sym.Symbol: the fused graph; it loads and runs in plain MXNet builds with oneDNN
        (the pip ``mxnet`` wheels), for inference only.

    Raises:
        mxnet.base.MXNetError: the backend refused the graph.
    """
    import mxnet as mx
    return sym.optimize_for(BACKEND, dict(arg_params or {}), dict(aux_params or {}),
                            ctx or mx.cpu(), shape_dict=dict(shapes or {}))


def unsafe_outputs(sym):
    """Names of ``sym``'s outputs that another node also consumes (list of str).

    MXNet 1.9.1's oneDNN fusion can return a wrong value for such an output: a FullyConnected
    whose output is a graph output and also feeds an Activation came back as the activation's
    result (FC and sigmoid fused; found by tests/test_graph_fuzz.py). Graphs with such outputs
    are not fused.
    """
    nodes = load(sym)
    consumed = {(i[0], i[1]) for n in nodes['nodes'] for i in n.get('inputs', [])}
    return [nodes['nodes'][h[0]]['name'] for h in nodes['heads']
            if (h[0], h[1]) in consumed and nodes['nodes'][h[0]]['op'] != 'null']


class FusedInference:
    """The fused inference graph of a ``gluon.SymbolBlock`` that shares its Parameters.

    A second ``SymbolBlock`` on the same Symbol and the same ``Parameter`` objects, hybridized
    with ``backend='MKLDNN'`` and the block's own flags (``static_alloc``...). Built on first
    use; rebuilt when the parameters may have changed; if MXNet refuses the fusion (an error, or
    no fused node in the result) it logs one line and :meth:`__call__` returns None from then on.

    Args:
        block (mxnet.gluon.SymbolBlock): the block (its ``_cached_graph`` and ``_flags``).
        precast (callable): ``precast(args)`` (the first call's input NDArrays) returns
            ``(symbol, names, dtype)``: a graph that takes the weights ``names`` (set of str) as
            ``dtype`` arrays instead of casting them, run with copies of the weights cast to
            ``dtype``. Default None: the block's own graph and parameters.
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

    def _current(self):
        """Whether the twin was built on the arrays the parameters hold now (by identity)."""
        return self.twin is not None and all(a is b for a, b in zip(self._arrays(), self._key))

    def __call__(self, *args):
        """Run the fused graph on NDArrays; None when fusion was refused (use the unfused one)."""
        if self.refused is not None:
            return None
        if self._current():
            return self.twin(*args)
        unsafe = unsafe_outputs(self.block._cached_graph[1])
        if unsafe:
            self.refused = ('output %s also feeds another node, where MXNet\'s fusion can '
                            'return a wrong value' % ', '.join(unsafe))
            logger.warning('%s: not fused (%s); inference runs the unfused graph',
                           self.block.name, self.refused)
            return None
        self.reset()  # the old fused graph's memory can go before the new one is made
        try:
            twin = self._build(args)
            out = twin(*args)
            for o in (out if isinstance(out, (list, tuple)) else [out]):
                o.wait_to_read()  # a refusal surfaces here, not later and far from the cause
            fused = count_fused(twin._cached_graph[1])
        except Exception as err:  # pylint: disable=broad-except  (logged, then unfused)
            self.refused = '%s: %s' % (type(err).__name__, str(err).strip().splitlines()[0]
                                       if str(err).strip() else '')
        else:
            if fused == 0:
                self.refused = 'no fusible pattern in the graph'
        if self.refused is not None:
            logger.warning('%s: oneDNN fusion refused (%s); inference runs the unfused graph',
                           self.block.name, self.refused)
            self.reset()
            return None
        self.twin, self._key = twin, self._arrays()  # after _build: deferred init done
        return out

    def _build(self, args):
        import mxnet as mx
        from mxnet import autograd, gluon
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
            sym, names, dtype = self._precast
            shared, params = params, gluon.ParameterDict()
            for name, param in shared.items():
                if name not in names:
                    params._params[name] = param
                    continue
                copy = gluon.Parameter(name, shape=param.shape, dtype=dtype, grad_req='null')
                with autograd.pause():
                    copy._init_impl(mx.nd.amp_cast(param.data(param.list_ctx()[0]), dtype=dtype),
                                    param.list_ctx())
                params._params[name] = copy
        twin = gluon.SymbolBlock(sym, inputs, params=params)
        twin.hybridize(backend=BACKEND, **dict(self.block._flags))
        return twin
