"""The kernel rule's LayerNorm copy (:func:`layer_norm_copies`): where the output of a LayerNorm
the rule runs in the library (``mxmp_layer_norm``) is read by exactly two node inputs, and by
nothing else (not a graph output; its mean and rstd unread, as the rule asks anyway), the
library op gets ``copy_out=1``: a fourth output, appended last (mean and rstd keep outputs 1
and 2: :data:`.kernel_rule.FLOAT32_OUTPUTS`), a copy of its output, which the second reader
(in the graph's order) reads in place of output 0. Its backward receives both gradients and
sums them itself (float32 arithmetic for bfloat16, rounded once, as MXNet's ``add_n`` of the
two) before the LayerNorm backward: MXNet no longer sums them with ``add_n``, whose bfloat16
kernel in MXNet 1.9.1 converts element by element (in BERT every LayerNorm's output feeds a
FullyConnected and the residual add: 24 sums an iteration of BERT-base). The same numbers, bit
for bit; the copy is kept for the backward (MXNet hands a library op's backward every output):
one more tensor of the output's size per LayerNorm. Any other reader layout keeps one output.

The residual rule (:mod:`.residual_rule`) gives the copy its own identity where it gives
output 0 one: where the LayerNorm then runs in float32, both would be cast to the target dtype
and their gradients cast back up and summed in float32, not as the one cast's ``add_n``: there
:func:`drop_cast_copies` takes the copy back before the plan is final (in BERT, the embeddings'
LayerNorm; the others take and give bfloat16 and keep it). Under emulation (float32 kernels)
every copy goes: the sum is float32 there anyway, and the copy would get its own rounding.

The rule (:func:`.kernel_rule.apply_kernels`) writes it; :func:`has_copy` tells
:func:`.kernel_undo.mxnet_ops` and ``strip`` which output the copy stands for when they undo it.
"""

from .symbol_json import MARK, RESIDUAL_MARK, TRUE_STRINGS as _TRUE

__all__ = ['COPY_OUT', 'COPY', 'layer_norm_copies', 'planned_copies', 'has_copy',
           'copy_rule_suffix', 'drop_cast_copies', 'drop_copies']

#: The attribute of ``mxmp_layer_norm`` that adds the copy, and the copy's output index.
COPY_OUT, COPY = 'copy_out', 3


def layer_norm_copies(js, chosen):
    """``{LayerNorm node id: (reader node id, input position)}`` of the LayerNorm copies
    (module docstring) among the ``chosen`` node ids of ``js`` (graph JSON): a chosen
    ``LayerNorm`` whose output 0 is read by exactly two node inputs (of any op, chosen or not),
    by no other output entry and not by the graph's heads; the value is the second reader (the
    later in the graph's order), which reads the copy."""
    nodes = js['nodes']
    lns = {nid for nid in chosen if nodes[nid]['op'] == 'LayerNorm'}
    if not lns:
        return {}
    readers = {}
    for nid, node in enumerate(nodes):
        for pos, (src, idx, _) in enumerate(node['inputs']):
            if src in lns:
                readers.setdefault(src, []).append((idx, nid, pos))
    for src, idx, _ in js['heads']:
        if src in lns:
            readers.setdefault(src, []).append((idx, None, None))
    return {src: max(got)[1:] for src, got in readers.items()
            if len(got) == 2 and all(idx == 0 and nid is not None for idx, nid, _ in got)}


def _residual(node):
    return node['op'] == '_copy' and node.get('attrs', {}).get(MARK) == RESIDUAL_MARK


def planned_copies(js, names, dtypes):
    """``{node name: explain note}`` of the nodes of ``js`` (graph JSON after the residual
    rule, before the kernel rule) the rule would give a LayerNorm copy (the LayerNorm and its
    second reader), ``names`` being the nodes it would run in the library
    (:func:`.kernel_rule.planned`: structure and environment alone), ``dtypes`` ``{node name:
    planned dtype}``. A residual identity's readers count as its LayerNorm's; a float32
    LayerNorm whose two readers both read it through one keeps no copy
    (:func:`drop_cast_copies`)."""
    if not names:
        return {}
    nodes = js['nodes']
    chosen = {nid for nid, n in enumerate(nodes) if n['name'] in names}
    via = {}   # a residual identity's node id -> the LayerNorm whose output 0 it passes on
    for nid, node in enumerate(nodes):
        if _residual(node) and node['inputs'][0][0] in chosen and node['inputs'][0][1] == 0:
            via[nid] = node['inputs'][0][0]
    seen = {'nodes': [dict(n, inputs=[] if nid in via else [
        [via.get(s, s), 0 if s in via else i, v] for s, i, v in n['inputs']])
        for nid, n in enumerate(nodes)],
            'heads': js['heads']}
    notes = {}
    for ln, (reader, _) in layer_norm_copies(seen, chosen).items():
        through = [pos for nid, n in enumerate(nodes) for pos, (s, _, _) in enumerate(
            n['inputs']) if via.get(s) == ln]
        if len(through) == 2 and dtypes.get(nodes[ln]['name']) == 'float32':
            continue   # both cast: drop_cast_copies takes the copy back
        notes[nodes[ln]['name']] = (
            'LayerNorm copy for %s: copy_out=1, a fourth output (a copy of its output) that %s '
            'reads, and the backward sums the two gradients of its output (no add_n)'
            % (nodes[reader]['name'], nodes[reader]['name']))
        notes[nodes[reader]['name']] = (
            "it reads %s's output copy (the kernel rule's copy_out=1: %s's backward sums the "
            'two gradients, no add_n)' % (nodes[ln]['name'], nodes[ln]['name']))
    return notes


def drop_cast_copies(js, decisions, every=False):
    """``js`` (graph JSON after the kernel and residual rules) without the copy of each
    LayerNorm the plan's ``decisions`` (one per node) run in float32 whose output 0 and copy
    are both read through a residual identity (module docstring), or of every LayerNorm where
    ``every`` (bool: emulated bfloat16, whose kernels are float32, or a graph that only
    runs inference; ``decisions`` is then not read): the copy's readers read output 0 (its
    residual identity's, output 0's identity), which was the graph without the copy. A new
    dict, or ``js`` itself where there is none."""
    nodes = js['nodes']
    ident = {}   # (LayerNorm id, output) -> its residual identity's id
    for nid, node in enumerate(nodes):
        if _residual(node) and has_copy(nodes[node['inputs'][0][0]]):
            ident[tuple(node['inputs'][0][:2])] = nid
    drop = {nid for nid, n in enumerate(nodes) if has_copy(n) and (every or (
        (nid, COPY) in ident and (nid, 0) in ident and decisions[nid].outputs[0] == 'float32'))}
    if not drop:
        return js
    gone = {ident[(ln, COPY)]: ident[(ln, 0)] for ln in drop
            if (ln, COPY) in ident and (ln, 0) in ident}
    out, new_id = [], {}
    for nid, node in enumerate(nodes):
        if nid in gone:
            continue
        if nid in drop:
            node = dict(node, attrs={k: v for k, v in node['attrs'].items() if k != COPY_OUT})
        out.append(dict(node, inputs=[_entry(new_id, gone, drop, e) for e in node['inputs']]))
        new_id[nid] = len(out) - 1
    return dict(js, nodes=out, heads=[_entry(new_id, gone, drop, e) for e in js['heads']])


def drop_copies(js):
    """``js`` (graph JSON) without any LayerNorm copy: each copy's readers read output 0. For
    graphs that only run inference (:func:`.kernel_undo.inference_only`), where no backward sums
    the two gradients and the copy would only cost a write of the output. A new dict, or ``js``
    itself where there is none."""
    return drop_cast_copies(js, None, every=True)


def _entry(new_id, gone, drop, entry):
    """``entry`` of :func:`drop_cast_copies`' new graph."""
    src, idx, version = entry
    if src in gone:
        return [new_id[gone[src]], 0, version]
    return [new_id[src], 0 if src in drop and idx == COPY else idx, version]


def has_copy(node):
    """bool: ``node`` is an ``mxmp_layer_norm`` with ``copy_out=1``, whose output :data:`COPY`
    stands for its output 0 when the rule is undone."""
    return node['op'] == 'mxmp_layer_norm' and node.get('attrs', {}).get(COPY_OUT) in _TRUE


def copy_rule_suffix(attrs):
    """The part of a library LayerNorm node's explain rule (str, '' for none) that names its
    copy, from the node's ``attrs`` (dict)."""
    return ("; copy_out=1: a fourth output, a copy of its output for the output's second "
            "reader, and its backward sums the two gradients (no add_n)"
            if attrs.get(COPY_OUT) in _TRUE else '')
