"""MXNet's own dtype inference on a graph JSON, by node position.

The pass asks MXNet which tensors are floating point (on the input graph) and checks the
converted graph against its plan (``Symbol.infer_type_partial``, MXNet 1.9.1). Nodes are keyed
by their position in ``js['nodes']``, never by name: a block called twice gives nodes with
equal names.
"""
import functools
import json
import re

import numpy as np

from ..dtypes import LOW_PRECISION_DTYPES, MSHADOW_ENUM, dtype_name
from .symbol_json import dump

__all__ = ['infer_dtypes', 'node_output_dtypes', 'mutable_inputs']


def infer_dtypes(js, input_dtypes):
    """(node id, out) -> dtype name of every visible output of a graph (JSON dict), from MXNet.

    Node ids are positions in ``js['nodes']``; names play no part, so a graph whose blocks are
    called twice (two nodes named ``relu0_fwd``) types like any other. Inputs without a dtype
    (given by name, or a ``__dtype__`` attribute) are taken as float32. Nodes that no head
    reaches are absent.
    """
    # A bfloat16 input must be typed through its variable's ``__dtype__`` attribute: MXNet
    # 1.9.1's Symbol.infer_type(_partial) silently drops bfloat16 keyword arguments (their numpy
    # type, np.void, is not in _DTYPE_NP_TO_MX), which left the input untyped and made
    # convert_symbol(..., 'bfloat16', data_dtypes={'data': 'bfloat16'}) raise (found by
    # tests/test_graph_fuzz.py). So bfloat16 and float16 inputs get the attribute on a copy.
    # Every node is renamed to its id on that copy: MXNet reports types per output name.
    nodes, args = [], {}
    for nid, node in enumerate(js['nodes']):
        attrs = node.get('attrs', {})
        d = input_dtypes.get(node['name'])
        if node['op'] == 'null':
            if d in LOW_PRECISION_DTYPES and '__dtype__' not in attrs:
                attrs = dict(attrs, __dtype__=MSHADOW_ENUM[d])
            if '__dtype__' not in attrs:
                args[str(nid)] = np.dtype(d or 'float32')
        nodes.append(dict(node, name=str(nid), attrs=attrs))
    internals = dump(dict(js, nodes=nodes)).get_internals()
    try:
        _, out_types, _ = internals.infer_type_partial(**args)
    except Exception as err:  # MXNetError: inconsistent dtypes
        names = [n['name'] for n in js['nodes']]
        message = _renamed_back(str(err), names)
        raise ValueError('MXNet cannot infer the dtypes of the graph: %s' % message) from err
    result, previous, k = {}, None, 0
    for p, dtype in enumerate(out_types):
        owner = int(internals[p].name)
        k = k + 1 if owner == previous else 0
        previous = owner
        result[(owner, k)] = dtype_name(dtype)
    return result


def _renamed_back(message, names):
    """MXNet's error text with the ids of :func:`infer_dtypes`' renamed nodes as names."""
    return re.sub(r'(operator |node )(\d+)\b',
                  lambda m: m.group(1) + (names[int(m.group(2))]
                                          if int(m.group(2)) < len(names) else m.group(2)),
                  message)


def node_output_dtypes(node, in_dtypes, n_out):
    """Output dtypes MXNet gives one node for the given input dtypes (a one-node graph)."""
    nodes = [{'op': 'null', 'name': 'i%d' % i, 'inputs': [],
              'attrs': {'__dtype__': MSHADOW_ENUM[d]}}
             for i, d in enumerate(in_dtypes)]
    nodes.append(dict(node, inputs=[[i, 0, 0] for i in range(len(in_dtypes))]))
    js = {'nodes': nodes, 'heads': [[len(in_dtypes), k, 0] for k in range(n_out)],
          'attrs': {'mxnet_version': ['int', 10901]}}
    types = infer_dtypes(js, {})
    return [types.get((len(in_dtypes), k)) for k in range(n_out)]


def mutable_inputs(node):
    """Positions of ``node``'s inputs that MXNet writes in place (FMutateInputs: BatchNorm's
    moving mean and variance): MXNet makes the variables there auxiliary states, so they must
    be graph variables, never the output of a cast. From a one-node graph of the same op and
    attributes (``Symbol.list_auxiliary_states``)."""
    return _mutable_inputs(node['op'], json.dumps(node.get('attrs', {}), sort_keys=True),
                           len(node['inputs']))


@functools.lru_cache(maxsize=None)
def _mutable_inputs(op, attrs, n_in):
    nodes = [{'op': 'null', 'name': 'i%d' % i, 'inputs': []} for i in range(n_in)]
    nodes.append({'op': op, 'name': 'node', 'attrs': json.loads(attrs),
                  'inputs': [[i, 0, 0] for i in range(n_in)]})
    js = {'nodes': nodes, 'heads': [[n_in, 0, 0]], 'attrs': {'mxnet_version': ['int', 10901]}}
    aux = set(dump(js).list_auxiliary_states())
    return tuple(i for i in range(n_in) if 'i%d' % i in aux)
