"""Forward FLOP of a network, counted from its graph with inferred shapes.

Counted: Convolution (any groups, stride, dilation, padding: the output shape carries them),
FullyConnected (flatten or not) and the matrix products of attention, 2 FLOP per
multiply-accumulate::

    Convolution:     2 * prod(output shape) * prod(weight shape[1:])
                     (weight = (out_channels, in_channels / groups, *kernel))
    FullyConnected:  2 * prod(output shape) * weight shape[1]
    batch_dot:       2 * prod(output shape) * K
                     (K = lhs shape[-1], or lhs shape[-2] with transpose_a)
    interleaved_matmul_selfatt_qk:      2 * prod(output shape) * qkv shape[2] / (3 * heads)
                     (qkv = (length, batch, 3 * units); output = (batch * heads, length, length))
    interleaved_matmul_selfatt_valatt:  2 * prod(output shape) * attention shape[2]
                     (attention = (batch * heads, length, length); output = (length, batch, units))

Everything else (bias adds, BatchNorm, LayerNorm, softmax, activations, pooling, elementwise,
embedding lookups) is not counted: in a CNN or a transformer it is well under 1% of the
multiply-accumulates, and it does not run on the GEMM units the peak measures. Training is counted as 3x forward (the backward pass computes the gradients of
the data and of the weights, each a GEMM of the forward's size); that factor is a convention
(:data:`TRAIN_FACTOR`), stated wherever a training figure uses it.
"""
import json

import numpy as np

__all__ = ['layer_flops', 'forward_flops_per_image', 'TRAIN_FACTOR', 'COUNTED_OPS', 'WEIGHT_OPS',
           'MATMUL_OPS']

#: Training FLOP = TRAIN_FACTOR x forward FLOP (forward + data gradient + weight gradient).
TRAIN_FACTOR = 3
#: Layers with a weight (FLOP from the output and the weight's shape).
WEIGHT_OPS = ('Convolution', 'FullyConnected')
#: Products of two computed tensors (FLOP from the output and the inputs' shapes).
#: mxmp's library ops for the attention products (mxmp_selfatt_*, mxmp_batch_dot) count as
#: MXNet's.
MATMUL_OPS = ('batch_dot', '_contrib_interleaved_matmul_selfatt_qk',
              '_contrib_interleaved_matmul_selfatt_valatt', 'mxmp_selfatt_qk',
              'mxmp_selfatt_valatt', 'mxmp_batch_dot')
COUNTED_OPS = WEIGHT_OPS + MATMUL_OPS


def _matmul_depth(node, inputs):
    """K of a MATMUL_OPS node: multiply-accumulates per output element."""
    op, attrs = node['op'], node.get('attrs', {})
    if op in ('batch_dot', 'mxmp_batch_dot'):
        return inputs[0][-2] if attrs.get('transpose_a', 'False') in ('True', 'true', '1') \
            else inputs[0][-1]
    if op in ('_contrib_interleaved_matmul_selfatt_qk', 'mxmp_selfatt_qk'):
        heads = int(attrs['heads'])
        return inputs[0][2] // (3 * heads)
    return inputs[1][2]  # valatt: (batch * heads, length, length) attention weights


def layer_flops(sym, data_shapes):
    """FLOP of every node of :data:`COUNTED_OPS` in ``sym`` for inputs ``data_shapes``.

    Args:
        sym (mxnet.sym.Symbol): the network (casts allowed; fused ``_sg_mkldnn_*`` nodes are not
            looked into: count on the unfused graph).
        data_shapes (dict of str -> tuple of int): input shapes, batch first,
            e.g. ``{'data': (1, 3, 224, 224)}``.

    Returns:
        list of dict: ``{'name', 'op', 'output_shape', 'weight_shape', 'flop'}`` in graph
        order; ``flop`` is for the whole batch (int); ``weight_shape`` is None for
        :data:`MATMUL_OPS` (they have ``input_shapes`` instead).

    Raises:
        ValueError: shapes could not be inferred (the message names the node).
    """
    internals = sym.get_internals()
    arg_shapes, out_shapes, aux_shapes = internals.infer_shape_partial(**data_shapes)
    args = dict(zip(internals.list_arguments(), arg_shapes))
    aux = dict(zip(internals.list_auxiliary_states(), aux_shapes))
    outs = dict(zip(internals.list_outputs(), out_shapes))
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    layers = []

    def shape_of(entry):  # [node id, output index, version] -> inferred shape or None
        source = nodes[entry[0]]
        if source['op'] == 'null':
            return args.get(source['name'], aux.get(source['name']))
        return outs.get('%s_output' % source['name'],
                        outs.get('%s_output%d' % (source['name'], entry[1])))

    for node in nodes:
        if node['op'] not in COUNTED_OPS:
            continue
        name = node['name']
        # the first output (mxmp_selfatt_qk with emit_v has a second: the values' copy)
        out = outs.get(name + '_output', outs.get(name + '_output0'))
        if node['op'] in MATMUL_OPS:
            shapes = [shape_of(e) for e in node['inputs']]
            if not out or 0 in out or any(not s or 0 in s for s in shapes):
                raise ValueError('cannot infer the shapes of %s (%s): output %s, inputs %s; '
                                 'give every data input a full shape'
                                 % (name, node['op'], out, shapes))
            layers.append({'name': name, 'op': node['op'], 'output_shape': tuple(out),
                           'weight_shape': None, 'input_shapes': [tuple(s) for s in shapes],
                           'flop': 2 * int(np.prod(out)) * int(_matmul_depth(node, shapes))})
            continue
        # The weight is the node's second input: a variable, or a cast of one.
        weight_node = nodes[node['inputs'][1][0]]
        while weight_node['op'] != 'null' and weight_node['inputs']:
            weight_node = nodes[weight_node['inputs'][0][0]]
        weight = args.get(weight_node['name'])
        if not out or not weight or 0 in out or 0 in weight:
            raise ValueError('cannot infer the shapes of %s (%s): output %s, weight %s; give '
                             'every data input a full shape' % (name, node['op'], out, weight))
        per_output = int(np.prod(weight[1:]))
        layers.append({'name': name, 'op': node['op'], 'output_shape': tuple(out),
                       'weight_shape': tuple(weight),
                       'flop': 2 * int(np.prod(out)) * per_output})
    return layers


def forward_flops_per_image(sym, image_shape, data_name='data'):
    """Forward FLOP for one image: the layers of a batch of 2 divided by 2.

    Args:
        sym (mxnet.sym.Symbol): the network.
        image_shape (tuple of int, or dict of str -> tuple of int): one image, e.g.
            ``(3, 224, 224)``; for a network with several inputs, each input's shape without
            the batch axis, e.g. ``{'inputs': (128,), 'token_types': (128,), 'valid_length':
            ()}`` for one sequence of 128 tokens.
        data_name (str): the input's name when ``image_shape`` is a tuple. Default ``'data'``.

    Returns:
        int: FLOP per image (per sample) of the layers of :data:`COUNTED_OPS`.

    Raises:
        ValueError: shapes could not be inferred, or the batch's FLOP is odd.
    """
    batch = 2  # not 1: a batch of 1 could hide a wrongly placed batch axis
    shapes = image_shape if isinstance(image_shape, dict) else {data_name: image_shape}
    layers = layer_flops(sym, {n: (batch,) + tuple(s) for n, s in shapes.items()})
    total = sum(l['flop'] for l in layers)
    if total % batch:
        raise ValueError('FLOP of a batch of %d not divisible by %d: a layer mixes images'
                         % (batch, batch))
    return total // batch
