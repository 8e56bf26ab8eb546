"""Zero-pad the stem convolution's odd input channel count, in the graph (a bfloat16 speed lever).

Measured on MXNet 1.9.1 with oneDNN's bfloat16 kernels [avx512_bf16]: a convolution with 3 input
channels (the stem of an image network) runs oneDNN's gemm-based kernel, which writes a plain
NCHW output, and the BatchNorm after it then runs the generic ``ncsp_bnorm`` kernel: the slowest
single node of a bfloat16 ResNet training step. With 4 input channels oneDNN picks its blocked
kernels instead (docs/benchmark.md has the measurements).

:func:`pad_stem` rewrites such a Convolution so that it sees ``C + 1`` channels, computing the
same function: its data becomes ``Concat(data, zeros_like(slice_axis(data, 1, 0, 1)))`` and its
weight ``Concat(weight, zeros_like(slice_axis(weight, 1, 0, 1)))`` (a zero column). The
``Parameter`` keeps its ``(out, C, kh, kw)`` shape, so checkpoints are unchanged and the graph
is plain MXNet (``Concat``, ``slice_axis``, ``zeros_like``). The gradient of the weight's real
columns is the same sum as before (the zero channel adds zero terms); the zero column's gradient
is dropped by ``Concat``'s backward. The added nodes take the dtype of what they pad (they go
after mxmp's casts), so in a converted bfloat16 graph they run in bfloat16. The weight variable
gets its full shape (``__shape__``): MXNet cannot infer it back through the ``Concat``, and
``mx.mod.Module`` binds a graph with the data shapes alone. :func:`mxmp.convert` applies it when
a converted network's graph is built (``pad_stem``, :mod:`mxmp._src.gluon_graph`).
"""
from .symbol_json import MARK, ROUND_MARK, STEM_MARK, STEM_SHAPE
from .symbol_json import dump as _dump, load as _load

__all__ = ['STEM_MARK', 'pad_stem', 'stem_convolutions', 'padded_convolutions',
           'check_option', 'wants_padding']



def _source(nodes, entry):
    """The node an input entry comes from, looking through the casts and the emulated rounding
    nodes mxmp wrote (each of them computes from its first input)."""
    node = nodes[entry[0]]
    while (node['op'] == 'amp_cast' and MARK in node.get('attrs', {})) or \
            ROUND_MARK in node.get('attrs', {}):
        node = nodes[node['inputs'][0][0]]
    return node


def stem_convolutions(sym, input_shapes):
    """The Convolutions of ``sym`` that :func:`pad_stem` pads.

    A Convolution qualifies when it is 2-D on the NCHW layout (no ``layout`` attribute, or
    ``'NCHW'``), has one group, and its data input is a graph input variable (directly or
    through casts or emulated rounding mxmp wrote) whose shape in ``input_shapes`` has an odd
    channel count (axis 1).

    Args:
        sym (mxnet.symbol.Symbol): any graph (float32 or converted).
        input_shapes (dict of str -> tuple of int): shapes of the graph's data inputs, e.g.
            ``{'data': (16, 3, 224, 224)}``; inputs not named are not considered.

    Returns:
        list of ``(convolution name, input name, channels)`` in topological order.

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
    """``sym`` with each stem Convolution (:func:`stem_convolutions`) fed ``C + 1`` channels:
    its data and its weight each concatenated with zeros along axis 1 (same function).

    Six nodes are added per padded convolution ``conv``, each with attribute
    :data:`STEM_MARK` = ``conv``: ``conv_stem_data_slice`` (``slice_axis``),
    ``conv_stem_data_zeros`` (``zeros_like``), ``conv_stem_data`` (``Concat``, ``dim=1``), and
    the same three named ``conv_stem_weight*`` for the weight. The weight must be a variable
    (through mxmp's casts) whose shape MXNet infers from ``input_shapes``; its shape is written
    into it (``__shape__``), as the padded graph no longer lets MXNet infer it. Nothing else
    changes: no new variable, so the parameters (and their shapes) are those of ``sym``.

    Args:
        sym (mxnet.symbol.Symbol): any graph (float32 or converted by mxmp).
        input_shapes (dict of str -> tuple of int): shapes of the data inputs (NCHW).

    Returns:
        mxnet.symbol.Symbol: the padded graph, or ``sym`` itself when nothing qualifies.

    Raises:
        TypeError: ``sym`` is not a Symbol.
    """
    js = _load(sym)
    nodes = js['nodes']
    stems = {nid for nid, _, _, _ in _stems(nodes, input_shapes)}
    if not stems:
        return sym
    # The padded graph hides the weight's channel count behind the Concat (MXNet cannot infer
    # it back through slice_axis): write the weight's shape into its variable (``__shape__``,
    # as Gluon does), so that the graph binds with the data shapes alone (mx.mod.Module).
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
    """Return ``option`` if it is a valid ``pad_stem`` value ('auto', True, False).

    Raises:
        ValueError: any other value; the message lists the valid ones.
    """
    if option not in ('auto', True, False):
        raise ValueError("pad_stem=%r: use 'auto' (for bfloat16 where the real kernels run), "
                         "True (always) or False (never)" % (option,))
    return option


def wants_padding(option, policy, ctx):
    """bool: whether ``pad_stem=option`` pads a graph converted with ``policy`` that runs on
    ``ctx`` (mx.Context). ``'auto'``: bfloat16 run by the real kernels (not emulated,
    :func:`mxmp.lp_kernels_available`), where it was measured faster; ``True``: always (a graph
    without a policy too); ``False``: never."""
    if option == 'auto':
        from ..device import lp_kernels_available
        return policy is not None and policy.target_dtype == 'bfloat16' and \
            not policy.emulate and lp_kernels_available('bfloat16', ctx)
    return bool(option)
