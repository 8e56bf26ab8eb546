"""Fold inference BatchNorm into the Convolution before it, in float32, before any rounding:
the graph rewrite of the fused inference graph (:class:`mxmp._src.fused_inference.FusedInference`,
``mxmp.convert(..., fold_batchnorm=...)``).

Why (docs/benchmark.md "Fused inference", measured on avx512_bf16): MXNet 1.9.1's oneDNN
Convolution+BatchNorm fusion folds BatchNorm into a bfloat16 convolution itself, computing
``weight * gamma / sqrt(var + eps)`` from the weight already rounded to bfloat16 and
converting the product, and the folded bias ``beta - mean * gamma / sqrt(var + eps)``, to
bfloat16 by truncation (mshadow's float-to-bfloat16 conversion drops the low 16 bits).
Truncation shrinks every folded weight and bias by half a bfloat16 ulp on average (0.1-0.4%
per layer), a bias that compounds through the network: a fused conv+BatchNorm layer reproduced
bit for bit by that model. Folded here, the weight is computed in float32 from the float32
weight and rounded once, to nearest even, by the pass's cast; the bias likewise. The fused
graph then holds no BatchNorm for MXNet to fold (it still fuses ReLU and the residual sum).

A BatchNorm is folded when its data is output 0 of a ``Convolution`` that feeds nothing else,
both in the channel-first layout (BatchNorm ``axis`` 1), the convolution's weight (and bias)
and the four BatchNorm inputs are graph variables, and ``output_mean_var`` is off.
"""
import collections

from .symbol_json import dump, load, unique_name

__all__ = ['FOLD_MARK', 'Fold', 'batchnorm_folds', 'fold_batchnorm', 'folded_values',
           'fold_rule']

#: Attribute key of the variables :func:`fold_batchnorm` adds; value: the folded BatchNorm.
FOLD_MARK = '__mxmp_fold__'   # a graph attribute key

#: One fold: the Convolution and BatchNorm node names, the variables they read (``bias`` None
#: without one; ``fix_gamma``: gamma taken as 1, as MXNet does), and the two new variables.
Fold = collections.namedtuple('Fold', 'conv bn weight bias gamma beta mean var eps fix_gamma '
                                      'new_weight new_bias')

_CHANNEL_FIRST = ('NCW', 'NCHW', 'NCDHW')


def _true(text, default):
    return default if text is None else str(text).lower() in ('true', '1')


def _pairs(nodes, heads):
    """``{conv id: bn id}`` of the foldable Convolution -> BatchNorm pairs (module docstring)."""
    uses = collections.Counter(tuple(e[:2]) for n in nodes for e in n['inputs'])
    uses.update(tuple(h[:2]) for h in heads)
    pairs = {}
    for bid, bn in enumerate(nodes):
        attrs = bn.get('attrs', {})
        if bn['op'] != 'BatchNorm' or len(bn['inputs']) != 5 or \
                int(attrs.get('axis', '1')) != 1 or _true(attrs.get('output_mean_var'), False):
            continue
        cid, out = bn['inputs'][0][:2]
        conv = nodes[cid]
        cattrs = conv.get('attrs', {})
        if conv['op'] != 'Convolution' or out != 0 or uses[(cid, 0)] != 1 or \
                cattrs.get('layout', 'None') not in ('None',) + _CHANNEL_FIRST:
            continue
        if all(nodes[e[0]]['op'] == 'null' for e in conv['inputs'][1:] + bn['inputs'][1:]):
            pairs[cid] = bid
    return pairs


def batchnorm_folds(sym):
    """``{BatchNorm name: Convolution name}`` of the BatchNorms :func:`fold_batchnorm` folds in
    ``sym`` (a Symbol or its graph JSON dict).

    Raises:
        TypeError: ``sym`` is neither.
    """
    js = sym if isinstance(sym, dict) else load(sym)
    nodes = js['nodes']
    return {nodes[b]['name']: nodes[c]['name'] for c, b in _pairs(nodes, js['heads']).items()}


def fold_batchnorm(sym):
    """``sym`` (a float32 inference Symbol) with every foldable BatchNorm removed and its
    Convolution reading two new variables instead of its weight and bias:
    ``<conv>_bnfold_weight`` (the weight's shape) and ``<conv>_bnfold_bias`` (one per output
    channel), marked :data:`FOLD_MARK`; their values come from :func:`folded_values`.

    Returns:
        tuple ``(Symbol, list of Fold)``: ``sym`` itself and ``[]`` when nothing qualifies.

    Raises:
        TypeError: ``sym`` is not a Symbol.
    """
    js = load(sym)
    nodes, heads = js['nodes'], js['heads']
    pairs = _pairs(nodes, heads)
    if not pairs:
        return sym, []
    taken = {n['name'] for n in nodes}
    removed = {b: c for c, b in pairs.items()}
    new_nodes, new_id, folds = [], {}, []

    def remap(entry):
        nid = removed.get(entry[0], entry[0])   # a folded BatchNorm's output is the conv's
        return [new_id[nid], entry[1], entry[2]]

    def variable(name, mark):
        new_nodes.append({'op': 'null', 'name': name, 'inputs': [],
                          'attrs': {FOLD_MARK: mark}})
        return [len(new_nodes) - 1, 0, 0]

    for nid, node in enumerate(nodes):
        if nid in removed:
            continue
        node = dict(node, inputs=[remap(e) for e in node['inputs']])
        if nid in pairs:
            bn = nodes[pairs[nid]]
            battrs = bn.get('attrs', {})
            names = [nodes[e[0]]['name'] for e in bn['inputs'][1:]]
            conv_in = [nodes[e[0]]['name'] for e in nodes[nid]['inputs']]
            fold = Fold(node['name'], bn['name'], conv_in[1],
                        conv_in[2] if len(conv_in) > 2 else None, *names,
                        float(battrs.get('eps', '0.001')),
                        _true(battrs.get('fix_gamma'), True),
                        unique_name(node['name'] + '_bnfold_weight', taken),
                        unique_name(node['name'] + '_bnfold_bias', taken))
            folds.append(fold)
            weight = variable(fold.new_weight, bn['name'])
            bias = variable(fold.new_bias, bn['name'])
            node['inputs'] = [node['inputs'][0], weight, bias]
            node['attrs'] = dict(node.get('attrs', {}), no_bias='False')
        new_nodes.append(node)
        new_id[nid] = len(new_nodes) - 1
    js = dict(js, nodes=new_nodes, heads=[remap(h) for h in heads])
    return dump(js), folds


def folded_values(fold, arrays):
    """The float32 values of ``fold``'s two new variables.

    Args:
        fold (Fold): from :func:`fold_batchnorm`.
        arrays (callable): ``arrays(name)`` gives the NDArray of a variable (any float dtype;
            computed in float32).

    Returns:
        tuple ``(weight, bias)`` of float32 NDArrays: ``weight * a`` per output channel and
        ``beta + (bias - mean) * a`` (``bias`` 0 without one), ``a = gamma / sqrt(var + eps)``
        (gamma 1 with ``fix_gamma``): BatchNorm's inference function, as MXNet folds it.
    """
    import mxnet as mx
    get = (lambda name: mx.nd.amp_cast(arrays(name), dtype='float32'))
    var = get(fold.var)
    gamma = mx.nd.ones_like(var) if fold.fix_gamma else get(fold.gamma)
    scale = gamma / mx.nd.sqrt(var + fold.eps)
    weight = get(fold.weight)
    folded = mx.nd.broadcast_mul(weight, scale.reshape((-1,) + (1,) * (weight.ndim - 1)))
    shift = get(fold.mean) * -1 if fold.bias is None else get(fold.bias) - get(fold.mean)
    return folded, get(fold.beta) + shift * scale


def fold_rule(conv):
    """The text :func:`mxmp.explain` adds to a BatchNorm's rule that fused inference folds into
    Convolution ``conv``."""
    return ('fused inference folds it into %s in float32, rounded once (MXNet\'s own fold '
            'truncates to bfloat16; fold_batchnorm=False of mxmp.convert turns it off)' % conv)
