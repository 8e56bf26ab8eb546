"""The pass's weight-concatenation rule: a ``Concat`` of parameters alone runs as MXNet's
``_npi_concatenate``, whose backward pass keeps nothing of the forward pass.

Why: MXNet 1.9.1's ``Concat`` gradient reads the op's inputs as well as the output gradient in
its oneDNN builds (``ConcatGrad`` in ``src/operator/nn/concat.cc`` under ``MXNET_USE_MKLDNN``,
for the oneDNN backward primitive's memory descriptors), so the backward pass keeps every input
from the forward pass. GluonNLP's self-attention cell reshapes its query, key and value weights
per head and concatenates them before one FullyConnected: the inputs are Reshape outputs of
Parameters, which MXNet copies (a variable's memory is not the graph's to share), so each
training step keeps a second copy of those weights until the backward pass reaches the
concatenation (81 MiB of float32 copies on BERT-base with ``cast_params=False``, 40.5 MiB of
bfloat16 ones with ``cast_params=True``: ``python -m benchmarks.backward_kept``).
``_npi_concatenate`` (MXNet's NumPy-interface concatenation, the same kernel family) takes the
same inputs and attribute (``axis``), writes the same values and its gradient reads the
output gradient only (MXNet's ``_backward_np_concat``), float32 and bfloat16 alike: the copies
are freed after the forward pass. Values and gradients are exact moves either way
(``tests/graph/test_concat_rule.py``).

Which nodes: ``Concat`` nodes of the converted graph whose inputs are functions of the
parameters alone (no data input upstream: Reshape, casts, emulation's rounding of weights).
Activations keep MXNet's oneDNN ``Concat``. The node keeps
its name; :func:`restore_graph` (called by ``strip``, so ``remove_casts`` and a conversion
of a converted graph see ``Concat`` again) puts the original back. Files mxmp writes keep
``_npi_concatenate``: it is one of MXNet 1.9.1's registered ops.
"""
from .symbol_json import MARK

__all__ = ['substitute', 'restore_graph', 'NP_CONCAT']

NP_CONCAT = '_npi_concatenate'
_PREFIX = 'weight_concat:'   # + the original ``dim`` attribute ('' when absent)


def substitute(js, data_names):
    """``js`` (a converted graph's JSON) with each ``Concat`` of parameters alone (module
    docstring) as ``_npi_concatenate``; ``data_names`` (set of str): the graph's data inputs.
    A new dict, or ``js`` itself where no node qualifies."""
    nodes = js['nodes']
    weights_only = []   # per node: a function of parameters alone (nodes in topological order)
    for node in nodes:
        weights_only.append(node['name'] not in data_names if node['op'] == 'null' else
                            all(weights_only[src] for src, _, _ in node['inputs']))
    chosen = [nid for nid, node in enumerate(nodes)
              if node['op'] == 'Concat' and all(weights_only[s] for s, _, _ in node['inputs'])]
    if not chosen:
        return js
    nodes = list(nodes)
    for nid in chosen:
        attrs = dict(nodes[nid].get('attrs', {}))
        dim = attrs.pop('dim', '')
        attrs.update({'axis': dim or '1', MARK: _PREFIX + dim})
        nodes[nid] = dict(nodes[nid], op=NP_CONCAT, attrs=attrs)
    return dict(js, nodes=nodes)


def restore_graph(js):
    """``js`` with the rule's nodes back to ``Concat`` with their original attributes. A new
    dict, or ``js`` where the rule wrote nothing."""
    marked = [nid for nid, n in enumerate(js['nodes']) if n['op'] == NP_CONCAT and
              n.get('attrs', {}).get(MARK, '').startswith(_PREFIX)]
    if not marked:
        return js
    nodes = list(js['nodes'])
    for nid in marked:
        attrs = dict(nodes[nid]['attrs'])
        dim = attrs.pop(MARK)[len(_PREFIX):]
        del attrs['axis']
        if dim:
            attrs['dim'] = dim
        nodes[nid] = dict(nodes[nid], op='Concat', attrs=attrs)
    return dict(js, nodes=nodes)

