"""Forward FLOP of a network, counted from its graph with inferred shapes.

Counted: Convolution (any groups, stride, dilation, padding: the output shape carries them) and
FullyConnected, 2 FLOP per multiply-accumulate::

    Convolution:     2 * prod(output shape) * prod(weight shape[1:])
                     (weight = (out_channels, in_channels / groups, *kernel))
    FullyConnected:  2 * prod(output shape) * weight shape[1]

Everything else (bias adds, BatchNorm, activations, pooling, elementwise) is not counted: in a
CNN it is well under 1% of the multiply-accumulates, and it does not run on the GEMM units the
peak measures. Training is counted as 3x forward (the backward pass computes the gradients of
the data and of the weights, each a GEMM of the forward's size); that factor is a convention
(:data:`TRAIN_FACTOR`), stated wherever a training figure uses it.
"""
import json

import numpy as np

__all__ = ['layer_flops', 'forward_flops_per_image', 'TRAIN_FACTOR', 'COUNTED_OPS']

#: Training FLOP = TRAIN_FACTOR x forward FLOP (forward + data gradient + weight gradient).
TRAIN_FACTOR = 3
COUNTED_OPS = ('Convolution', 'FullyConnected')


def layer_flops(sym, data_shapes):
    """FLOP of every Convolution and FullyConnected node of ``sym`` for inputs ``data_shapes``.

    Args:
        sym (mxnet.sym.Symbol): the network (casts allowed; fused ``_sg_mkldnn_*`` nodes are not
            looked into: count on the unfused graph).
        data_shapes (dict of str -> tuple of int): input shapes, batch first,
            e.g. ``{'data': (1, 3, 224, 224)}``.

    Returns:
        list of dict: ``{'name', 'op', 'output_shape', 'weight_shape', 'flop'}`` in graph
        order; ``flop`` is for the whole batch (int).

    Raises:
        ValueError: shapes could not be inferred (the message names the node).
    """
    internals = sym.get_internals()
    arg_shapes, out_shapes, _ = internals.infer_shape_partial(**data_shapes)
    args = dict(zip(internals.list_arguments(), arg_shapes))
    outs = dict(zip(internals.list_outputs(), out_shapes))
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    layers = []
    for node in nodes:
        if node['op'] not in COUNTED_OPS:
            continue
        name = node['name']
        out = outs.get(name + '_output')
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
        image_shape (tuple of int): one image, e.g. ``(3, 224, 224)``.
        data_name (str): the input's name. Default ``'data'``.

    Returns:
        int: FLOP per image of the Convolution and FullyConnected layers.
    """
    batch = 2  # not 1: a batch of 1 could hide a wrongly placed batch axis
    layers = layer_flops(sym, {data_name: (batch,) + tuple(image_shape)})
    total = sum(l['flop'] for l in layers)
    if total % batch:
        raise ValueError('FLOP of a batch of %d not divisible by %d: a layer mixes images'
                         % (batch, batch))
    return total // batch
