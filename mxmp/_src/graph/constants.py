"""Constant folding for inference-only graphs (:func:`mxmp.freeze`): a node computed from
weights alone, such as GluonNLP's concatenation of the query, key and value weights and its
cast to bfloat16, the stem padding's zero channel, or the operator library's input copies of
LayerNorm's gamma and beta, is computed once and becomes a variable holding its value, as
``torch.jit.freeze`` does. Its inputs then leave the graph (and their arrays can be released).

A node is constant when it has inputs and each one is a variable other than the graph's data
or another constant node, and it is not a random op. A constant output read by a non-constant
node (or a head) is folded unless its value is larger than the variables it is computed from
(a broadcast, for example), which would cost memory.
"""
import numpy as np

from ..dtypes import MSHADOW_ENUM, dtype_name
from .symbol_json import dump, load, unique_name

__all__ = ['fold_constants']

_RANDOM = ('_random_', '_sample_', 'Dropout', '_shuffle')
#: Ops that read the values of some of their inputs only (MXNet's FIgnoreInputs): the kernel
#: rule's copies of gamma and beta take only their shape from data (``rhs``). Such a node is
#: constant when those inputs are; its value is computed as a ``_copy`` of them.
_VALUE_INPUTS = {'_identity_with_attr_like_rhs': (0,)}


def _value_inputs(node):
    """The inputs whose values ``node`` reads (:data:`_VALUE_INPUTS`)."""
    keep = _VALUE_INPUTS.get(node['op'])
    return node['inputs'] if keep is None else [node['inputs'][k] for k in keep]


def _subgraph(nodes, head):
    """The JSON of the graph that computes output ``head`` ((node id, output)) of ``nodes``."""
    keep, stack = set(), [head[0]]
    while stack:
        nid = stack.pop()
        if nid not in keep:
            keep.add(nid)
            stack.extend(i for i, _, _ in _value_inputs(nodes[nid]))
    order = sorted(keep)
    new_id = {nid: k for k, nid in enumerate(order)}
    sub = [dict(nodes[nid], op='_copy' if nodes[nid]['op'] in _VALUE_INPUTS else nodes[nid]['op'],
                inputs=[[new_id[i], o, v] for i, o, v in _value_inputs(nodes[nid])])
           for nid in order]
    return {'nodes': sub, 'heads': [[new_id[head[0]], head[1], 0]], 'attrs': {}}


def _evaluate(js, arrays, ctx):
    """The value (NDArray) of the single head of ``js``, from ``arrays`` (name -> NDArray)."""
    sym = dump(js)
    args = {n: arrays[n] for n in sym.list_arguments()}
    aux = {n: arrays[n] for n in sym.list_auxiliary_states()}
    executor = sym.bind(ctx, args, aux_states=aux, grad_req='null')
    out = executor.forward(is_train=False)[0]
    out.wait_to_read()
    return out


def fold_constants(sym, data_names, arrays, ctx, release=None):
    """Fold the constant nodes of ``sym`` (module docstring).

    Args:
        sym (mxnet.sym.Symbol): an inference graph.
        data_names (iterable of str): its data variables (never constant).
        arrays (dict): name -> NDArray of every other variable.
        ctx (mxnet.Context): where the values are computed.
        release (callable or None): ``release(name)`` is called for each variable as soon as
            the folded graph no longer reads it (its array can be freed before the next value
            is computed).

    Returns:
        tuple ``(Symbol, dict)``: the graph, and the NDArrays of the variables it adds (name ->
        value, with their dtypes). ``sym`` itself and ``{}`` when nothing is folded.
    """
    js = load(sym)
    nodes, data_names = js['nodes'], set(data_names)
    const = []
    for node in nodes:
        if node['op'] == 'null':
            const.append(node['name'] not in data_names)
        else:
            const.append(bool(node['inputs']) and not node['op'].startswith(_RANDOM) and
                         all(const[i] for i, _, _ in _value_inputs(node)))
    frontier = {(i, o) for nid, n in enumerate(nodes) if not const[nid]
                for i, o, _ in n['inputs'] if const[i] and nodes[i]['op'] != 'null'}
    frontier |= {(i, o) for i, o, _ in js['heads'] if const[i] and nodes[i]['op'] != 'null'}
    taken = {n['name'] for n in nodes}
    replaced, added = {}, {}
    subgraphs = {head: _subgraph(nodes, head) for head in sorted(frontier)}
    # variables read by a node that stays: never released
    pending = {nodes[i]['name']: set() for nid, n in enumerate(nodes) if not const[nid]
               for i, _, _ in n['inputs'] if nodes[i]['op'] == 'null'}
    pending.update({nodes[i]['name']: set() for i, _, _ in js['heads']
                    if nodes[i]['op'] == 'null'})
    kept = set(pending)
    for head, sub in subgraphs.items():
        for n in sub['nodes']:
            if n['op'] == 'null':
                pending.setdefault(n['name'], set()).add(head)
    for head, sub in subgraphs.items():
        sources = [n['name'] for n in sub['nodes'] if n['op'] == 'null']
        value = _evaluate(sub, arrays, ctx)
        source_bytes = sum(arrays[n].size * np.dtype(arrays[n].dtype).itemsize for n in sources)
        if value.size * np.dtype(value.dtype).itemsize > source_bytes:
            kept.update(sources)   # a larger array than its sources: cheaper computed per call
            continue
        for name in sources:
            pending[name].discard(head)
            if not pending[name] and name not in kept and release is not None:
                release(name)
        name = unique_name('%s_output%d_const' % (nodes[head[0]]['name'], head[1]), taken)
        nodes.append({'op': 'null', 'name': name, 'inputs': [],
                      'attrs': {'__dtype__': MSHADOW_ENUM[dtype_name(value.dtype)],
                                '__shape__': str(tuple(value.shape))}})
        replaced[head] = len(nodes) - 1
        added[name] = value
    if not added:
        return sym, {}
    for node in nodes:
        node['inputs'] = [[replaced[(i, o)], 0, 0] if (i, o) in replaced else [i, o, v]
                          for i, o, v in node['inputs']]
    heads = [[replaced[(i, o)], 0, 0] if (i, o) in replaced else [i, o, v]
             for i, o, v in js['heads']]
    # the new variables first (they have no inputs), then the nodes still used, in order
    used, stack = set(), [i for i, _, _ in heads]
    while stack:
        nid = stack.pop()
        if nid not in used:
            used.add(nid)
            stack.extend(i for i, _, _ in nodes[nid]['inputs'])
    order = sorted(replaced.values()) + [n for n in range(len(nodes) - len(replaced))
                                         if n in used]
    new_id = {nid: k for k, nid in enumerate(order)}
    out = [dict(nodes[nid], inputs=[[new_id[i], o, v] for i, o, v in nodes[nid]['inputs']])
           for nid in order]
    js = dict(js, nodes=out, heads=[[new_id[i], o, v] for i, o, v in heads])
    return dump(js), added
