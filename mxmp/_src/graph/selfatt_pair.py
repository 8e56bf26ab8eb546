"""The kernel rule's self-attention pair (:func:`selfatt_pairs`): where one tensor (the QKV
projection's output) is read by exactly one ``selfatt_qk`` and one ``selfatt_valatt`` of the same
``heads``, and by nothing else (not a graph output either), and the qk node comes first,
``mxmp_selfatt_qk`` gets ``emit_v=1``: a second output, a copy of the values' part,
(seq, batch, heads * d), which ``mxmp_selfatt_valatt`` reads with ``v_only=1`` in place of
the whole tensor. Its backward then writes dV, and the qk's backward writes the whole
gradient of the tensor once (queries and keys from the scores' gradient, values from dV):
MXNet no longer sums two gradients each two-thirds zeros (an ``add_n`` per attention
layer, whose bfloat16 kernel converts element by element). The same arithmetic (bit for
bit); the values' copy, 1/3 of the tensor, is kept for the backward (MXNet hands a library
op's backward every output). Any other reader layout keeps the two ops reading the tensor.

The rule (:func:`.kernel_rule.apply_kernels`) writes the pair; :func:`pair_source` tells
:func:`.kernel_undo.mxnet_ops` and ``strip`` which input the values stand for when they undo it.
"""

from .symbol_json import TRUE_STRINGS as _TRUE

__all__ = ['EMIT_V', 'V_ONLY', 'selfatt_pairs', 'planned_pairs', 'pair_note', 'pair_source',
           'pair_rule_suffix', 'drop_pairs']

#: Attributes of the self-attention pair: ``mxmp_selfatt_qk`` emits the values as a second
#: output, ``mxmp_selfatt_valatt`` reads them alone.
EMIT_V, V_ONLY = 'emit_v', 'v_only'


def selfatt_pairs(js, chosen):
    """``{valatt node id: qk node id}`` of the self-attention pairs (module docstring) among
    the ``chosen`` node ids of ``js`` (graph JSON): a tensor read by exactly one chosen
    ``_contrib_interleaved_matmul_selfatt_qk`` and one chosen ``..._selfatt_valatt`` (as its
    first input), with the same ``heads``, by no other node or input and not a graph output,
    the qk node first in the graph's order."""
    qk, va = ('_contrib_interleaved_matmul_selfatt_qk',
              '_contrib_interleaved_matmul_selfatt_valatt')
    nodes = js['nodes']
    readers = {}
    for nid, node in enumerate(nodes):
        for pos, (src, idx, _) in enumerate(node['inputs']):
            readers.setdefault((src, idx), []).append((nid, pos))
    for src, idx, _ in js['heads']:
        readers.setdefault((src, idx), []).append((None, None))
    pairs = {}
    for got in readers.values():
        if len(got) != 2 or any(pos != 0 or nid not in chosen for nid, pos in got):
            continue
        (a, _), (b, _) = sorted(got)
        if nodes[a]['op'] == qk and nodes[b]['op'] == va and \
                nodes[a]['attrs'].get('heads') == nodes[b]['attrs'].get('heads'):
            pairs[b] = a
    return pairs


def planned_pairs(js, names):
    """``{node name: explain note}`` of the nodes of ``js`` (graph JSON) the rule would make a
    self-attention pair, ``names`` being the nodes it would run in the library
    (:func:`.kernel_rule.planned`: structure and environment alone)."""
    if not names:
        return {}
    nodes = js['nodes']
    chosen = {nid for nid, n in enumerate(nodes) if n['name'] in names}
    notes = {}
    for va, qk in selfatt_pairs(js, chosen).items():
        notes[nodes[qk]['name']] = pair_note(EMIT_V, nodes[va]['name'])
        notes[nodes[va]['name']] = pair_note(V_ONLY, nodes[qk]['name'])
    return notes


def pair_note(flag, partner):
    """The explain note (str) of a node of a self-attention pair: ``flag`` its attribute
    (``'emit_v'`` or ``'v_only'``), ``partner`` the other node's name."""
    if flag == 'emit_v':
        return ('self-attention pair with %s: emit_v=1, a second output (the values, a copy) '
                'that it reads, and the backward writes the whole QKV gradient once (no add_n)'
                % partner)
    return ('self-attention pair with %s: v_only=1, it reads the values %s emits, and its '
            'backward writes their gradient alone (no add_n of the QKV gradient)'
            % (partner, partner))


def pair_source(node):
    """The input entry ``[src, idx, version]`` a self-attention pair's ``mxmp_selfatt_qk``
    (``emit_v``) reads, which its second output (the values) stands for when the pair is
    undone; None for other nodes."""
    if node['op'] != 'mxmp_selfatt_qk' or node.get('attrs', {}).get(EMIT_V) not in _TRUE:
        return None
    return node['inputs'][0]


def drop_pairs(js):
    """``js`` (graph JSON) without any self-attention pair: each ``mxmp_selfatt_qk`` loses
    ``emit_v`` (one output), each ``mxmp_selfatt_valatt`` that read its values loses ``v_only``
    and reads the tensor the qk reads, as the two library ops do outside a pair (the same
    numbers: the values are a copy of that tensor's part). For graphs that only run inference
    (:func:`.kernel_undo.inference_only`), where no backward writes the tensor's gradient and
    the values' copy would only cost a write. A new dict, or ``js`` itself where there is
    none."""
    nodes = js['nodes']
    sources = {nid: pair_source(n) for nid, n in enumerate(nodes)}
    sources = {nid: src for nid, src in sources.items() if src is not None}
    if not sources:
        return js
    out = []
    for node in nodes:
        attrs = node.get('attrs', {})
        if node['op'] == 'mxmp_selfatt_qk' and EMIT_V in attrs:
            node = dict(node, attrs={k: v for k, v in attrs.items() if k != EMIT_V})
        elif node['op'] == 'mxmp_selfatt_valatt' and V_ONLY in attrs:
            src, idx, _ = node['inputs'][0]
            if idx != 1 or src not in sources:
                raise ValueError('mxmp: %s (v_only=1) does not read a self-attention pair\'s '
                                 'values (an internal error of the kernel rule)' % node['name'])
            node = dict(node, attrs={k: v for k, v in attrs.items() if k != V_ONLY},
                        inputs=[list(sources[src])] + node['inputs'][1:])
        out.append(node)
    return dict(js, nodes=out)


def pair_rule_suffix(attrs):
    """The part of a library attention node's explain rule (str, '' for none) that names its
    place in a self-attention pair, from the node's ``attrs`` (dict)."""
    return ('; a self-attention pair: emit_v=1, it also outputs the values its valatt '
            'reads, and its backward writes the whole QKV gradient once (no add_n)'
            if attrs.get(EMIT_V) in _TRUE else
            '; a self-attention pair: v_only=1, it reads the values its qk emits, its '
            'backward writes their gradient alone (no add_n of the QKV gradient)'
            if attrs.get(V_ONLY) in _TRUE else '')
