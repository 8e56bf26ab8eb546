"""Undoing the kernel rule (:mod:`.kernel_rule`): MXNet's own ops back in place of the library's
in every file mxmp writes (:func:`mxnet_ops`) and in inference-only graphs where MXNet's op
costs nothing (:func:`inference_only`). Loaded by the first conversion or export, not by
``import mxmp``.
"""
from .rule_notes import residual_rule_of
from .symbol_json import MARK, unique_name

__all__ = ['LOW_KERNEL', 'inference_only', 'mxnet_ops']

#: MXNet ops the rule replaces whose MXNet 1.9.1 kernel takes bfloat16 (GELU's ``LeakyReLU``:
#: oneDNN's, ``mxmp check-kernels`` ok): undone, they read the library op's dtype, no cast.
LOW_KERNEL = ('LeakyReLU',)


def _rule():   # the kernel rule, loaded by the first conversion (not by `import mxmp`)
    from . import kernel_rule
    return kernel_rule


def _undo(js, undo, bypass=lambda node: False):
    """``js`` with the rule's nodes for which ``undo(node, restored)`` is true put back
    (copies read their input again, flags and shape ties dropped with whatever reads them once
    no library op does; a library
    node marked low precision comes back in float32 between two casts), and the library nodes
    for which ``bypass(node)`` is true replaced by their data input. A self-attention pair
    (the kernel rule's ``emit_v``/``v_only``) is undone whole or not at all: its valatt reads
    the qk's input again (the values' output is gone); a LayerNorm copy's reader reads the
    undone LayerNorm's output 0 again (:mod:`.ln_copy`)."""
    from .selfatt_pair import pair_source   # with the kernel rule, not by `import mxmp`
    from .ln_copy import COPY, has_copy
    nodes = js['nodes']
    names = {n['name'] for n in nodes}
    out, new_id, resolve = [], {}, {}
    values_of = {}   # undone pair's qk node id -> the entry it reads (its values' output's)
    copied = set()   # undone LayerNorms with a copy (output 3 stands for output 0)

    def entry(src, idx, version):
        if idx == 1 and src in values_of:
            return entry(values_of[src][0], values_of[src][1], version)
        if idx == COPY and src in copied:
            return entry(src, 0, version)
        return (resolve[src] + [version] if src in resolve and idx == 0 else
                [new_id[src], idx, version])

    def cast(src, dtype, base):   # marked as the pass's: remove_casts strips it
        out.append({'op': 'amp_cast', 'name': unique_name('%s_amp_cast_%s' % (base, dtype), names),
                    'attrs': {MARK: 'cast', 'dtype': dtype}, 'inputs': [src]})
        return [len(out) - 1, 0, 0]

    dropped = set()
    for nid, node in enumerate(nodes):
        if residual_rule_of(node) is not None:   # the residual rule's identity: a plan-time
            src, idx, _ = node['inputs'][0]      # device, its consumers read its input (the cast)
            idx = 0 if idx == COPY and src in copied else idx   # (a LayerNorm copy's: out)
            resolve[nid] = resolve[src] if src in resolve and idx == 0 else [new_id[src], idx]
            continue
        back = _rule().restore(node)
        if back is not None and not undo(node, back):
            back = None
        paired = [s for s, i, _ in node['inputs'] if i == 1 and
                  pair_source(nodes[s]) is not None]
        if paired and (paired[0] in values_of) != isinstance(back, dict):   # one half of a pair
            raise ValueError('mxmp: the self-attention pair %s / %s must be undone together '
                             '(an internal error of the kernel rule\'s undo)'
                             % (nodes[paired[0]]['name'], node['name']))
        if isinstance(back, dict) and pair_source(node) is not None:
            values_of[nid] = node['inputs'][0]
        if isinstance(back, dict) and has_copy(node):
            copied.add(nid)
        reads = (back['inputs'] if isinstance(back, dict) else
                 node['inputs'][:1] if back == 'input' else node['inputs'])
        if back == 'drop' or any(s in dropped for s, _, _ in reads):
            dropped.add(nid)   # a flag or shape tie, or what only reads one (the pass's cast)
            continue
        if back == 'input' or (isinstance(back, dict) and bypass(node)):
            src, idx, _ = node['inputs'][0]
            resolve[nid] = resolve[src] if src in resolve and idx == 0 else [new_id[src], idx]
            continue
        low = _rule().kernel_dtype(node) if isinstance(back, dict) else None
        if isinstance(back, dict) and back['op'] in LOW_KERNEL:   # no casts: MXNet runs it
            low = None
        if isinstance(back, dict):
            node = back
        inputs = [entry(s, i, v) for s, i, v in node['inputs']]
        if low is not None:   # MXNet's op in float32 between two casts (low data inputs:
            for k in range(len(inputs)) if node['op'] in _rule().ATTENTION else (0,):   # all or 0)
                inputs[k] = cast(inputs[k], 'float32', node['name'])
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
        if low is not None:   # the rule substitutes nodes whose other outputs are not read
            resolve[nid] = cast([len(out) - 1, 0, 0], low, node['name'])[:2]
    heads = [entry(s, i, v) for s, i, v in js['heads']]
    return dict(js, nodes=out, heads=heads)


def inference_only(js):
    """``js`` (a converted graph's JSON) for a graph that only runs inference (the oneDNN-fused
    twin, :func:`mxmp.freeze`): the rule's ``mxmp_dropout`` nodes back to MXNet's Dropout, which
    MXNet runs as the identity in inference at no cost (the library op copies), and the flag
    removed; a bfloat16 one in the default mode (no bfloat16 Dropout in MXNet) is removed (its
    consumers read its input). ``mxmp_gelu`` back to MXNet's GELU in its dtype (oneDNN's fusion
    folds it into the FullyConnected before it: docs/benchmark.md, "Where mxmp's inference time
    goes"). The LayerNorm copies and the self-attention pairs go too: they are there for the
    backward's gradient sums (:func:`.ln_copy.drop_copies`, :func:`.selfatt_pair.drop_pairs`).
    A new dict, or ``js`` where there is nothing to undo."""
    from .ln_copy import drop_copies   # with the kernel rule, not by `import mxmp`
    from .selfatt_pair import drop_pairs
    js = drop_pairs(drop_copies(js))
    rule = _rule()
    flag = rule.FLAG
    undone = ('Dropout', 'LeakyReLU')
    if not any(n.get('attrs', {}).get(MARK) == flag or rule.original_op(n) in undone
               for n in js['nodes']):
        return js
    return _undo(js, lambda node, back: node.get('attrs', {}).get(MARK) == flag or
                 isinstance(back, dict) and back['op'] in undone,
                 bypass=lambda node: rule.original_op(node) == 'Dropout' and
                 rule.kernel_dtype(node) is not None and
                 node['attrs'].get('mode', 'training') != 'always')


def mxnet_ops(js):
    """``js`` (graph JSON) with every node of the rule undone: MXNet's own ops in place of the
    library's (same attributes, float32; between casts where the library op ran in bfloat16),
    the input copies, the training flag and the residual rule's identities gone (their
    consumers read the cast before them); casts and stored dtypes stay. What every file
    mxmp writes holds unless the user asks for the library ops: plain MXNet loads it. A new
    dict, or ``js`` where the rule wrote nothing."""
    if not any(_rule().restore(n) is not None for n in js['nodes']):
        return js
    return _undo(js, lambda node, back: True)
