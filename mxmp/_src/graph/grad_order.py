"""The pass's gradient-order rule: a converted graph walks its parameters latest-used first, so
that MXNet runs each weight cast's backward as soon as its layer's backward is done.

Why: MXNet 1.9.1 orders a graph's inputs by a depth-first walk from its outputs (nnvm's
``DFSVisit``: a node's inputs in order, then its control dependencies, then the node), and
CachedOp and the executor ask the gradient pass for the parameters' gradients in that order;
the backward nodes are then scheduled by the same walk over those gradients. A weight that the
graph casts to the target dtype (or rounds, emulated) before its layer gets a backward node of
that cast, which depends on its layer's backward alone. In the default walk the first
parameter is the first layer's, whose gradient depends on the whole backward pass, and every
other parameter's cast backward is scheduled after it: each layer's target-dtype weight
gradient stays allocated until the end of the backward pass (on BERT-base b8 s128, 162 MiB of
bfloat16 gradients at the peak: docs/benchmark.md, "The weight gradients' casts"). With the
parameters latest-used first, each cast backward follows its layer's backward and the memory
of its target-dtype gradient is reused.

How: the first variable of the walk gets control dependencies on the parameters that reach
their first data-dependent consumer through other nodes (casts, reshapes, rounding), latest
first use first. A variable's control dependencies order the walk and nothing else: no op runs
for a variable, values and gradients are the same (``tests/graph/test_grad_order.py``).

Where: only the graph a converted Gluon block's CachedOp is built on
(:func:`mxmp._src.gluon_graph.build_in_walk_order`), never a Symbol mxmp returns or writes:
MXNet 1.9.1's subgraph partitioner, which a symbolic executor bound for inference runs (oneDNN
fusion), refuses any node with control dependencies. :func:`.symbol_json.load` drops every
variable's control dependencies, so each step of mxmp that reads a graph sees the plain one.
"""

__all__ = ['substitute']


def substitute(js, data_names):
    """``js`` (a converted graph's JSON, dict, nodes in topological order) with its parameters
    (variables not in ``data_names``, a set of str) in the walk order of the module docstring.
    A new dict, or ``js`` itself where no parameter reaches its layer through another node."""
    nodes = js['nodes']
    consumers = [[] for _ in nodes]
    for nid, node in enumerate(nodes):
        for src, _, _ in node['inputs']:
            consumers[src].append(nid)
    weights_only = []   # a function of parameters alone
    for node in nodes:
        weights_only.append(node['name'] not in data_names if node['op'] == 'null' else
                            all(weights_only[src] for src, _, _ in node['inputs']))
    first_use = [None] * len(nodes)   # the first data-dependent node a node's value reaches
    for nid in reversed(range(len(nodes))):
        if not weights_only[nid]:
            first_use[nid] = nid
        else:
            uses = [first_use[c] for c in consumers[nid] if first_use[c] is not None]
            first_use[nid] = min(uses) if uses else None
    params = [nid for nid, node in enumerate(nodes)
              if node['op'] == 'null' and weights_only[nid] and first_use[nid] is not None]
    if not any(first_use[nid] not in consumers[nid] for nid in params):
        return js   # every parameter is read by its layer directly: no cast backward to move
    order = sorted(params, key=lambda nid: -first_use[nid])   # stable: ties keep node order
    first = _first_variable(nodes, js['heads'])
    new = list(nodes)
    new[first] = dict(nodes[first], control_deps=[p for p in order if p != first])
    return dict(js, nodes=new)


def _first_variable(nodes, heads):
    """The id of the first variable nnvm's depth-first walk from ``heads`` reaches."""
    stack, seen = [h[0] for h in reversed(heads)], set()
    while stack:
        nid = stack.pop()
        if nid in seen:
            continue
        seen.add(nid)
        node = nodes[nid]
        if node['op'] == 'null':
            return nid
        # inputs in order, then control dependencies: the first unseen one is walked first
        stack.extend(reversed([s for s, _, _ in node['inputs']] +
                              list(node.get('control_deps', []))))
    raise ValueError('a graph without variables')
