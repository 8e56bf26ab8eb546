"""A block converted by :func:`mxmp.convert` that runs inside a hybridized parent the user did
not convert: the parent's graph holds the child's nodes (Gluon traces the whole parent as one
graph), so the child's nodes are planned in the parent's graph with the child's settings and
every other node is kept in float32 (:func:`scoped_conversion`).

Which nodes are the child's: Gluon 1.9.1 traces each ``hybrid_forward`` inside its block's
``name_scope()`` (``HybridBlock.forward``), so every node a converted block (or a block inside
it) creates is named with that block's prefix; a ``SymbolBlock`` keeps its graph's node names.
"""
import dataclasses

from mxnet import gluon

from .graph.symbol_json import load

__all__ = ['converted_inside', 'scoped_conversion', 'no_graph_message']


def _descendants(block):
    """The blocks inside ``block`` (not itself), each once."""
    out, seen, stack = [], set(), list(block._children.values())
    while stack:
        child = stack.pop()
        if id(child) not in seen:   # id(): a set local to this call (a shared child)
            seen.add(id(child))   # id(): as above
            out.append(child)
            stack.extend(child._children.values())
    return out


def converted_inside(block, converted):
    """The converted blocks inside ``block`` (a HybridBlock not converted itself) and their one
    Conversion: ``(blocks, conversion)``, or ``([], None)`` when none is converted.

    Args:
        block (mxnet.gluon.HybridBlock): the parent whose graph is being built.
        converted (Mapping): block -> :class:`~mxmp._src.gluon_graph.Conversion` (what
            :func:`mxmp.convert` registered).

    Raises:
        ValueError: the converted blocks inside were converted with different settings (one
            graph cannot hold two policies); the message names the fix.
    """
    blocks = [b for b in _descendants(block) if b in converted]
    conversions = {converted[b] for b in blocks}
    if len(conversions) > 1:
        raise ValueError(
            '%s is hybridized and its graph holds blocks converted by mxmp.convert with '
            'different settings (%s); one graph takes one policy. Convert %s itself '
            '(mxmp.convert(%s, ...)) instead of its children.'
            % (block.name, ', '.join(sorted({b.name for b in blocks})), block.name, block.name))
    return blocks, (conversions.pop() if conversions else None)


def scoped_conversion(block, blocks, conversion, sym):
    """The Conversion that plans the nodes of the converted ``blocks`` in ``block``'s traced
    float32 graph ``sym`` with ``conversion``'s policy and keeps every other node in float32
    (``Policy.excluded_names``); the stem padding is off (the stem may be the parent's).

    Raises:
        RuntimeError: a converted block's nodes cannot be told apart in the parent's graph
            (its prefix starts the parent's: ``prefix=''``), or a Parameter of a converted
            block is read there by none of its nodes: its layers would run in float32. The
            message names the fix.
    """
    prefixes = [b.prefix for b in blocks if not isinstance(b, gluon.SymbolBlock)]
    fixed = set()
    for b in blocks:
        if isinstance(b, gluon.SymbolBlock) and b._cached_graph:
            fixed.update(n['name'] for n in load(b._cached_graph[1])['nodes'] if n['op'] != 'null')
    nodes = load(sym)['nodes']
    same = [p for p in prefixes if block.prefix.startswith(p)]
    if same:   # the parent's own nodes would carry it too
        _refuse(block, blocks, 'a converted block has the prefix %r of the parent' % same[0])

    def inside(name):
        return name in fixed or any(name.startswith(p) for p in prefixes)
    outside = frozenset(n['name'] for n in nodes if n['op'] != 'null' and not inside(n['name']))
    own = {p.name for b in blocks for p in b.collect_params().values()}
    planned = {nodes[i]['name'] for n in nodes if n['op'] != 'null' and n['name'] not in outside
               for i, _, _ in n['inputs'] if nodes[i]['op'] == 'null'}
    missed = sorted(n['name'] for n in nodes if n['op'] == 'null' and n['name'] in own and
                    n['name'] not in planned)
    if missed:
        _refuse(block, blocks, 'no node of theirs reads %s' % ', '.join(missed[:3]))
    policy = conversion.policy.replace(excluded_names=conversion.policy.excluded_names | outside)
    return dataclasses.replace(conversion, policy=policy, pad_stem=False)


def _refuse(block, blocks, why):
    raise RuntimeError(
        '%s is hybridized and runs %s, converted by mxmp.convert, inside its own graph, where '
        'mxmp cannot find their nodes (%s): they would run in float32. Convert %s itself '
        '(mxmp.convert(%s, ...)) instead.' % (block.name, ', '.join(b.name for b in blocks), why,
                                             block.name, block.name))


def no_graph_message(block, built):
    """Why :func:`mxmp.converted_graph` has no graph for ``block``: the parent among ``built``
    (blocks with a converted graph) whose graph runs it, else the steps to build one."""
    host = next((h for h in built if any(b is block for b in _descendants(h))), None)
    if host is not None:
        return ('%s runs inside the graph of its hybridized parent %s: '
                'converted_graph(%s)' % (block.name, host.name, host.name))
    return ('%s has no mixed-precision graph yet: convert it (mxmp.convert or mxmp.amp.init), '
            'hybridize it and call it once' % block.name)
