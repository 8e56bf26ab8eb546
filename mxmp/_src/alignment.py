"""Tensor Core alignment check: the Convolution, Deconvolution and FullyConnected sizes that are not
multiples of 8 float16 elements. Rules: NVIDIA's *Deep Learning Performance* guide
(https://docs.nvidia.com/deeplearning/performance/), summarised in docs/cli.md.
"""
import dataclasses
import math
from typing import Optional, Tuple

from .graph.symbol_json import load

#: Operators whose sizes are checked.
ALIGNED_OPS = ('Convolution', 'Deconvolution', 'FullyConnected')

_GUIDE = "NVIDIA Deep Learning Performance guide"
_RULE_CHANNELS = (_GUIDE + ", Convolutional Layers: input and output channels multiples of "
                  "%d for float16 (required before cuDNN 7.3)")
_RULE_GROUP = (_GUIDE + ", Convolutional Layers, applied per group: a grouped convolution is "
               "one GEMM per group")
_RULE_DEPTHWISE = ("depthwise convolution: per-channel GEMM with K = filter size, too small "
                   "for Tensor Core tiles; padding channels does not help")
_RULE_CONV_M = (_GUIDE + ", Convolutional Layers (implicit GEMM M = batch * output spatial "
                "size) and Matrix Multiplication Background: M, N, K multiples of %d")
_RULE_FC = (_GUIDE + ", Linear/Fully-Connected Layers: batch, input and output features are "
            "the GEMM sizes M/N/K, multiples of %d")


@dataclasses.dataclass(frozen=True)
class Misalignment:
    """One size of one layer that is not a multiple of the alignment.

    Attributes:
        layer (str): the node name in the graph (e.g. ``'conv0_fwd'``).
        op (str): ``'Convolution'``, ``'Deconvolution'`` or ``'FullyConnected'``.
        dimension (str): which size: ``'in_channels'``, ``'out_channels'``,
            ``'in_channels_per_group'``, ``'out_channels_per_group'``, ``'depthwise'``,
            ``'M'`` (convolutions: batch * output spatial size), or for FullyConnected
            ``'in_features'`` (GEMM K), ``'out_features'`` (GEMM M), ``'batch'`` (GEMM N).
        size (int): the current size.
        padded (int or None): the size to pad to (the next multiple); None when padding does
            not help (depthwise convolutions).
        fix (str): what to change, e.g. ``'in_channels 3 -> pad to 8'``.
        rule (str): the rule that applies and its source.
        data_shape (tuple of int): the layer's input data shape.
        weight_shape (tuple of int): the layer's weight shape.
        output_shape (tuple of int): the layer's output shape.
    """
    layer: str
    op: str
    dimension: str
    size: int
    padded: Optional[int]
    fix: str
    rule: str
    data_shape: Tuple[int, ...] = ()
    weight_shape: Tuple[int, ...] = ()
    output_shape: Tuple[int, ...] = ()


def _round_up(n, multiple):
    return -(-n // multiple) * multiple


def _to_symbol(net_or_symbol, input_shapes):
    import mxnet as mx
    if isinstance(net_or_symbol, mx.sym.Symbol):
        return net_or_symbol
    from mxnet import gluon
    if isinstance(net_or_symbol, gluon.HybridBlock):
        out = net_or_symbol(*[mx.sym.var(name) for name in input_shapes])
        return mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
    raise TypeError('check_alignment needs a gluon.HybridBlock or an mxnet.symbol.Symbol, got '
                    '%s; a plain gluon.Block cannot be traced into a graph'
                    % type(net_or_symbol).__name__)


def _infer_shapes(sym, input_shapes):
    """(node name, output index) -> shape of every visible output of ``sym``."""
    internals = sym.get_internals()
    try:
        _, out_shapes, _ = internals.infer_shape_partial(**input_shapes)
    except Exception as err:  # MXNetError: inconsistent shapes
        raise ValueError('MXNet cannot infer the shapes of the graph from input_shapes=%r: %s'
                         % (input_shapes, err)) from err
    result, previous, k = {}, None, 0
    for p, shape in enumerate(out_shapes):
        owner = internals[p].name
        k = k + 1 if owner == previous else 0
        previous = owner
        result[(owner, k)] = tuple(shape) if shape is not None else None
    return result


def _conv_rows(attrs, data, out, multiple):
    """``(dimension, size, padded, fix, rule)`` of each misaligned size of a convolution."""
    layout = attrs.get('layout', 'None')
    c_axis = 1 if layout == 'None' else layout.index('C')
    batch = data[0]
    spatial_out = [s for i, s in enumerate(out) if i not in (0, c_axis)]
    groups = int(attrs.get('num_group', '1'))
    in_channels, out_channels = data[c_axis], out[c_axis]
    rows = []
    if groups > 1 and in_channels // groups == 1:
        rows.append(('depthwise', in_channels, None,
                     'none: depthwise (%d groups of 1 input channel, %d output channel(s) each) '
                     'cannot use Tensor Cores efficiently; leave it, or replace it by a dense '
                     'convolution' % (groups, out_channels // groups), _RULE_DEPTHWISE))
    elif groups > 1:
        for dim, total in (('in_channels_per_group', in_channels),
                           ('out_channels_per_group', out_channels)):
            per, padded = total // groups, _round_up(total // groups, multiple)
            if per % multiple:
                rows.append((dim, per, padded, '%s %d (%d / %d groups) -> pad to %d (%s %d)'
                             % (dim, per, total, groups, padded, dim.split('_per')[0],
                                padded * groups), _RULE_GROUP))
    else:
        for dim, size in (('in_channels', in_channels), ('out_channels', out_channels)):
            if size % multiple:
                rows.append((dim, size, _round_up(size, multiple), '%s %d -> pad to %d'
                             % (dim, size, _round_up(size, multiple)), _RULE_CHANNELS % multiple))
    m = batch * int(math.prod(spatial_out))
    if m % multiple:
        per_image = int(math.prod(spatial_out))
        batch_step = multiple // math.gcd(multiple, per_image)
        rows.append(('M', m, _round_up(m, multiple),
                     'M = batch*%s = %s = %d -> use a batch size that is a multiple of %d '
                     '(e.g. %d gives M = %d), or pad M to %d'
                     % ('*'.join('out_%s' % a for a in ('D', 'H', 'W')[-len(spatial_out):])
                        if spatial_out else '1',
                        '*'.join(str(s) for s in [batch] + spatial_out), m, batch_step,
                        _round_up(batch, batch_step), _round_up(batch, batch_step) * per_image,
                        _round_up(m, multiple)), _RULE_CONV_M % multiple))
    # N = out channels and K = in channels * filter size follow from the channel rule.
    return rows


def _fc_rows(attrs, data, weight, multiple):
    """``(dimension, size, padded, fix, rule)`` of each misaligned GEMM size of a
    FullyConnected layer."""
    flatten = attrs.get('flatten', 'True').lower() in ('true', '1')
    if flatten:
        batch, in_features = data[0], int(math.prod(data[1:]))
    else:
        batch, in_features = int(math.prod(data[:-1])), data[-1]
    out_features = weight[0]
    rows = []
    for dim, gemm, size in (('in_features', 'K', in_features),
                            ('out_features', 'M', out_features), ('batch', 'N', batch)):
        if size % multiple:
            padded = _round_up(size, multiple)
            what = 'batch size' if dim == 'batch' else dim
            rows.append((dim, size, padded, '%s %d (GEMM %s) -> pad to %d'
                         % (what, size, gemm, padded), _RULE_FC % multiple))
    return rows


def check_alignment(net_or_symbol, input_shapes, multiple=8):
    """List the Convolution, Deconvolution and FullyConnected sizes that are not multiples of
    ``multiple``: channels (per group), convolutions' implicit-GEMM M = batch * output spatial
    size, fully-connected GEMM sizes (output features, batch, input features).

    Args:
        net_or_symbol (mxnet.gluon.HybridBlock or mxnet.symbol.Symbol): the model; a block is
            traced with one ``mx.sym.var`` per key of ``input_shapes``, in order.
        input_shapes (dict of str -> tuple of int): shape of each data input, batch first,
            e.g. ``{'data': (32, 3, 224, 224)}``.
        multiple (int): the alignment in elements; default 8 (16 bytes of float16). Use 4 for
            TF32, 16 for int8.

    Returns:
        list of :class:`Misalignment`, one per misaligned size, in graph order.

    Raises:
        TypeError: ``net_or_symbol`` is neither a HybridBlock nor a Symbol.
        ValueError: ``input_shapes`` is not a non-empty dict, ``multiple`` is not a positive
            int, or MXNet cannot infer a checked layer's shapes (the message names the inputs).
    """
    if not isinstance(input_shapes, dict) or not input_shapes:
        raise ValueError('input_shapes must be a non-empty dict of input name -> shape, e.g. '
                         "{'data': (32, 3, 224, 224)}; got %r" % (input_shapes,))
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise ValueError('multiple must be a positive int (8 for float16), got %r'
                         % (multiple,))
    input_shapes = {k: tuple(int(s) for s in v) for k, v in input_shapes.items()}
    sym = _to_symbol(net_or_symbol, input_shapes)
    unknown_inputs = sorted(set(input_shapes) - set(sym.list_arguments()))
    if unknown_inputs:
        raise ValueError('input_shapes names %s, which the graph does not have; its inputs '
                         'are %s' % (', '.join(unknown_inputs), ', '.join(sym.list_arguments())))
    shapes = _infer_shapes(sym, input_shapes)
    nodes = load(sym)['nodes']
    rows = []
    for node in nodes:
        op = node['op']
        if op not in ALIGNED_OPS:
            continue
        attrs = node.get('attrs', {})
        entry = lambda e: shapes.get((nodes[e[0]]['name'], e[1]))  # noqa: E731
        data, weight = entry(node['inputs'][0]), entry(node['inputs'][1])
        out = shapes.get((node['name'], 0))
        if not data or not weight or not out or 0 in data + weight + out:
            missing = [n for n in sym.list_arguments() if n not in input_shapes
                       and not shapes.get((n, 0))]
            raise ValueError('cannot infer the shapes of %s %s from input_shapes=%r; inputs '
                             'without a known shape: %s. Give every data input a full shape.'
                             % (op, node['name'], input_shapes, ', '.join(missing) or '?'))
        found = (_fc_rows(attrs, data, weight, multiple) if op == 'FullyConnected'
                 else _conv_rows(attrs, data, out, multiple))
        rows.extend(Misalignment(node['name'], op, *row, data, weight, out) for row in found)
    return rows


def format_alignment(rows):
    """str: :func:`check_alignment` rows as a table (layer, op, dimension, size, fix), or one
    line when there are none."""
    if not rows:
        return 'Tensor Core alignment: every Convolution/Deconvolution/FullyConnected size is ' \
               'aligned'
    header = ('layer', 'op', 'dimension', 'size', 'fix')
    table = [header] + [(r.layer, r.op, r.dimension, str(r.size), r.fix) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    lines = []
    for k, line in enumerate(table):
        lines.append('  '.join(cell.ljust(w) for cell, w in zip(line, widths)) + '  ' + line[-1])
        if k == 0:
            lines.append('  '.join('-' * w for w in widths) + '  ' + '-' * 3)
    lines.append('%d misaligned size(s) in %d layer(s); rules: NVIDIA Deep Learning Performance '
                 'guide (Tensor Cores, float16)' % (len(rows), len({r.layer for r in rows})))
    return '\n'.join(lines)
