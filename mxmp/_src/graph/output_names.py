"""The outputs of a converted Symbol under the float32 graph's names (:func:`keep_output_names`).

The pass casts a low-precision graph output back to float32 with a cast node of its own name
(``logits`` becomes ``logits_amp_cast_float32``), so ``list_outputs()`` would differ from the
float32 graph's, and MXNet's metrics, which find outputs by name
(``mx.metric.Accuracy(output_names=['logits_output'])``), would not find them. Here the cast
takes the name and the op it reads gets another one; :data:`NAME_MARK` keeps the op's own name,
which :func:`mxmp._src.graph.strip.strip` gives back.
"""
from .symbol_json import NAME_MARK, dump, load, unique_name

__all__ = ['keep_output_names', 'NAME_MARK']

_SUFFIX = '_output'   # MXNet's name of the output of a one-output node: '<node>_output'


def keep_output_names(sym, names):
    """``sym`` with its graph outputs renamed to ``names`` where a cast node took their place.

    Args:
        sym (mx.sym.Symbol): a converted graph.
        names (list of str): the float32 graph's ``list_outputs()``, one per output of ``sym``.

    Returns:
        mx.sym.Symbol: the graph whose ``list_outputs()`` equals ``names`` for every output
        that is a one-output node (the outputs of a multi-output op keep the cast's name).
    """
    js = load(sym)
    nodes = [dict(n) for n in js['nodes']]
    taken = {n['name'] for n in nodes}
    for (nid, _, _), want, have in zip(js['heads'], names, sym.list_outputs()):
        node = nodes[nid]
        if have == want or not want.endswith(_SUFFIX) or node['op'] == 'null' or \
                have != node['name'] + _SUFFIX:
            continue   # the same name; a variable; an output of a multi-output op
        target = want[:-len(_SUFFIX)]
        holders = [i for i, n in enumerate(nodes) if n['name'] == target]
        if any(nodes[i]['op'] == 'null' for i in holders):
            continue   # a variable's name is its argument name: never renamed
        for i in holders:
            attrs = dict(nodes[i].get('attrs', {}))
            attrs.setdefault(NAME_MARK, target)
            nodes[i] = dict(nodes[i], name=unique_name(target + '_mxmp_named', taken),
                            attrs=attrs)
        nodes[nid] = dict(node, name=target)
    return dump(dict(js, nodes=nodes))
