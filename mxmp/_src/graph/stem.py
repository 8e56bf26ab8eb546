"""Feed a stem Convolution with an odd input channel count (the 3-channel stem of an NCHW image
network) one zero channel more, in the graph: the same function, and oneDNN's blocked bfloat16
kernels run it (docs/pass.md). :func:`mxmp.convert` applies it (``pad_stem``).
"""
from .symbol_json import MARK, ROUND_MARK, STEM_MARK, STEM_SHAPE
from .symbol_json import dump as _dump, load as _load

__all__ = ['STEM_MARK', 'pad_stem', 'stem_convolutions', 'padded_convolutions',
           'check_option', 'wants_padding']


def _source(nodes, entry):
    """The node an input entry comes from, through mxmp's casts and rounding nodes."""
    node = nodes[entry[0]]
    while (node['op'] == 'amp_cast' and MARK in node.get('attrs', {})) or \
            ROUND_MARK in node.get('attrs', {}):
        node = nodes[node['inputs'][0][0]]
    return node


def stem_convolutions(sym, input_shapes):
    """``[(convolution name, input name, channels)]`` of the Convolutions of ``sym`` that
    :func:`pad_stem` considers, in topological order: 2-D, NCHW, one group, data from an input
    variable (through mxmp's casts) whose shape in ``input_shapes`` (``{name: shape}``) has an
    odd axis 1. It pads those whose weight is also a variable of known shape.

    Raises:
        TypeError: ``sym`` is not a Symbol.
    """
    return [(node['name'], src['name'], channels)
            for _, node, src, channels in _stems(_load(sym)['nodes'], input_shapes)]


def _stems(nodes, input_shapes):
    for nid, node in enumerate(nodes):
        if node['op'] != 'Convolution' or len(node['inputs']) < 2:
            continue
        attrs = node.get('attrs', {})
        kernel = attrs.get('kernel', '()').strip('()[] ').split(',')
        if attrs.get('layout', 'NCHW') != 'NCHW' or len([k for k in kernel if k.strip()]) != 2 \
                or int(attrs.get('num_group', '1')) != 1:
            continue
        src = _source(nodes, node['inputs'][0])
        shape = input_shapes.get(src['name']) if src['op'] == 'null' else None
        if shape is not None and len(shape) == 4 and shape[1] % 2 == 1:
            yield nid, node, src, int(shape[1])


def pad_stem(sym, input_shapes):
    """``sym`` with each :func:`stem_convolutions` entry fed ``C + 1`` channels: its data and
    its weight (a variable of shape MXNet infers from ``input_shapes``, which gets its
    ``__shape__`` written) each concatenated with zeros along axis 1 by three nodes
    (``conv_stem_data_slice``, ``_zeros``, ``conv_stem_data``; ``conv_stem_weight*``) marked
    :data:`STEM_MARK` = ``conv``. No new variable. Returns ``sym`` itself when nothing qualifies.

    Raises:
        TypeError: ``sym`` is not a Symbol.
    """
    js = _load(sym)
    nodes = js['nodes']
    stems = {nid for nid, _, _, _ in _stems(nodes, input_shapes)}
    if not stems:
        return sym
    # The weight's shape goes into its variable: MXNet cannot infer it back through the Concat.
    names = sym.list_arguments()
    known = sym.infer_shape_partial(**{k: v for k, v in input_shapes.items() if k in names})[0]
    known = dict(zip(names, known))
    for nid in sorted(stems):
        weight = _source(nodes, nodes[nid]['inputs'][1])
        shape = known.get(weight['name']) if weight['op'] == 'null' else None
        if not shape or 0 in shape:
            stems.discard(nid)  # no variable of known shape: leave this convolution alone
            continue
        attrs = weight.get('attrs', {})
        # marked with the shape it had, so that remove_casts restores it (once: a weight shared
        # by two stems keeps its first mark)
        mark = attrs.get(STEM_MARK, STEM_SHAPE + attrs.get('__shape__', ''))
        weight['attrs'] = dict(attrs, __shape__=str(tuple(shape)), **{STEM_MARK: mark})
    if not stems:
        return sym
    new_nodes, new_id = [], {}

    def remap(entry):
        return [new_id[entry[0]], entry[1], entry[2]]

    def padded(entry, base, conv):
        def add(op, suffix, inputs, attrs):
            new_nodes.append({'op': op, 'name': base + suffix, 'inputs': inputs,
                              'attrs': dict(attrs, **{STEM_MARK: conv})})
            return [len(new_nodes) - 1, 0, 0]
        first = add('slice_axis', '_slice', [entry], {'axis': '1', 'begin': '0', 'end': '1'})
        zeros = add('zeros_like', '_zeros', [first], {})
        return add('Concat', '', [entry, zeros], {'dim': '1', 'num_args': '2'})

    for nid, node in enumerate(nodes):
        node = dict(node)
        node['inputs'] = [remap(e) for e in node['inputs']]
        if nid in stems:
            name = node['name']
            node['inputs'][0] = padded(node['inputs'][0], name + '_stem_data', name)
            node['inputs'][1] = padded(node['inputs'][1], name + '_stem_weight', name)
        new_nodes.append(node)
        new_id[nid] = len(new_nodes) - 1
    js = dict(js)
    js['nodes'] = new_nodes
    js['heads'] = [remap(h) for h in js['heads']]
    return _dump(js)


def padded_convolutions(sym):
    """Names of the convolutions :func:`pad_stem` padded in ``sym`` (sorted; empty if none)."""
    return sorted({n['attrs'][STEM_MARK] for n in _load(sym)['nodes']
                   if n['op'] != 'null' and STEM_MARK in n.get('attrs', {})})


def check_option(option):
    """``option`` if it is ``'auto'``, True or False, else ValueError."""
    if option not in ('auto', True, False):
        raise ValueError("pad_stem=%r: use 'auto' (for bfloat16 where the real kernels run), "
                         "True (always) or False (never)" % (option,))
    return option


def wants_padding(option, policy, ctx):
    """bool: whether ``pad_stem=option`` pads a graph converted with ``policy`` (or None) that
    runs on ``ctx``; ``'auto'``: bfloat16 on real kernels, not emulated."""
    if option == 'auto':
        from ..device import lp_kernels_available
        return policy is not None and policy.target_dtype == 'bfloat16' and \
            not policy.emulate and lp_kernels_available('bfloat16', ctx)
    return bool(option)
