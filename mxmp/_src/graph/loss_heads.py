"""The loss-scale node in front of every loss op of a Symbol (:func:`insert_loss_scale`).

For a loss op whose data input is ``x``: ``b = BlockGrad(x)``, ``y = b + (x - b) * S``. Forward,
``y`` equals ``x`` bit for bit for finite ``x``; backward, the gradient into ``x`` is the loss
op's times ``S`` (exact for a power of two). ``S`` is the graph input :data:`LOSS_SCALE_NAME`,
which :class:`mxmp.Module` binds as a state. Loss ops that propagate their output's gradient
(:data:`HEAD_GRADIENT_LOSS_OPS`) get none: their gradient is scaled downstream (a ``MakeLoss``,
or the ``out_grads`` the Module scales), so every gradient is scaled once. The ``_mxmp_`` names
below are graph node and variable names, not side channels.
"""
from .symbol_json import MARK, dump, load, unique_name
from ..dtypes import MSHADOW_ENUM
from ..policy.policy import LOSS_OUTPUT, Policy

__all__ = ['insert_loss_scale', 'scaled_loss_ops', 'LOSS_SCALE_NAME',
           'HEAD_GRADIENT_LOSS_OPS', 'NAMED_LOSS_OPS']

#: Name of the input variable (a Module *state*, shape ``(1,)``, float32) holding the scale.
LOSS_SCALE_NAME = '__mxmp_loss_scale__'   # a graph variable name, not a side channel
#: Loss ops that always get the loss-scale node, whatever the policy says.
NAMED_LOSS_OPS = frozenset(('SoftmaxOutput', 'LinearRegressionOutput',
                            'LogisticRegressionOutput', 'MAERegressionOutput', 'MakeLoss'))
#: LOSS_OUTPUT ops whose backward multiplies by their output's gradient (MXNet asks for a head
#: gradient at a graph output, src/executor/graph_executor.cc): no node.
HEAD_GRADIENT_LOSS_OPS = ('CTCLoss', '_contrib_CTCLoss', '_contrib_ctc_loss', 'ctc_loss',
                          'softmax_cross_entropy')


def scaled_loss_ops(policy):
    """frozenset of the ops whose data input gets the node: :data:`NAMED_LOSS_OPS`, bfloat16's
    and ``policy``'s (or None) ``LOSS_OUTPUT`` ops, minus :data:`HEAD_GRADIENT_LOSS_OPS`."""
    ops = set(NAMED_LOSS_OPS) | set(Policy('bfloat16').ops_in(LOSS_OUTPUT))
    if policy is not None:
        ops |= set(policy.ops_in(LOSS_OUTPUT))
    return frozenset(ops - set(HEAD_GRADIENT_LOSS_OPS))


def insert_loss_scale(sym, loss_ops=None):
    """Put the loss-scale node in front of the data input of every loss op of ``sym``.

    Args:
        sym (mx.sym.Symbol): a graph (float32 or converted by mxmp).
        loss_ops (iterable of str or None): ops that get the node; default
            :func:`scaled_loss_ops` of no policy.

    Returns:
        tuple ``(symbol, count)``: the graph with the extra input :data:`LOSS_SCALE_NAME`
        (shape ``(1,)``, float32), and the number of nodes inserted (one per tensor).

    Raises:
        ValueError: ``sym`` already holds :data:`LOSS_SCALE_NAME`.
    """
    if LOSS_SCALE_NAME in sym.list_arguments():
        raise ValueError('the graph already holds the loss-scale input %r; pass the float32 '
                         'graph (mxmp.Module.symbol), not the bound one' % LOSS_SCALE_NAME)
    loss_ops = scaled_loss_ops(None) if loss_ops is None else frozenset(loss_ops)
    js = load(sym)
    names = {n['name'] for n in js['nodes']}
    nodes, remap, scaled = [], {}, {}
    scale_var = []

    def add(node):
        nodes.append(node)
        return len(nodes) - 1

    def scaling(op, name, inputs):   # node names: graph names, not side channels
        return add({'op': op, 'name': unique_name(name, names), 'attrs': {MARK: 'loss_scale'},
                    'inputs': inputs})

    def scale_entry(entry, base):
        key = (entry[0], entry[1])
        if key not in scaled:
            if not scale_var:
                scale_var.append(add({'op': 'null', 'name': LOSS_SCALE_NAME, 'inputs': [],
                                      'attrs': {'__shape__': '(1,)',
                                                '__dtype__': MSHADOW_ENUM['float32'],
                                                MARK: 'loss_scale'}}))
            stop = scaling('BlockGrad', base + '_mxmp_stop', [list(entry)])
            diff = scaling('elemwise_sub', base + '_mxmp_zero', [list(entry), [stop, 0, 0]])
            mul = scaling('broadcast_mul', base + '_mxmp_scaled',
                          [[diff, 0, 0], [scale_var[0], 0, 0]])
            scaled[key] = scaling('elemwise_add', base + '_mxmp_loss_scale',
                                  [[stop, 0, 0], [mul, 0, 0]])
        return [scaled[key], 0, 0]

    for old, node in enumerate(js['nodes']):
        node = dict(node)
        inputs = [[remap[src], idx, ver] for src, idx, ver in node.get('inputs', [])]
        if node['op'] in loss_ops and inputs:
            src_name = js['nodes'][node['inputs'][0][0]]['name']
            inputs[0] = scale_entry(inputs[0], src_name)
        node['inputs'] = inputs
        remap[old] = add(node)
    out = dict(js)
    out['nodes'] = nodes
    out['heads'] = [[remap[src], idx, ver] for src, idx, ver in js['heads']]
    return dump(out), len(scaled)
