"""Loss heads of a Symbol: the loss-scale node in front of every loss op, and the low-precision
parameters a converted graph stores.

The loss-scale node, for a loss op ``L`` whose data input is ``x`` (float32: the pass keeps
loss ops in float32)::

    b = BlockGrad(x)
    y = b + (x - b) * S            # L(y, label) instead of L(x, label)

Forward: ``x - b`` is exactly 0 for every finite ``x``, ``0 * S`` is 0 and ``b + 0`` is ``x``:
``y`` is bit-identical to ``x`` (the only difference: ``-0.0`` becomes ``+0.0``, and inf/NaN
become NaN, which the overflow check catches anyway). Backward: the gradient reaching ``x`` is
the loss op's gradient times ``S`` through one multiply (``BlockGrad`` passes nothing), exact
for a power-of-two ``S`` unless it overflows, which is the point of the check. ``S`` lives in
an input variable of the graph, :data:`LOSS_SCALE_NAME`, that :class:`mxmp.Module` binds as a
state and rewrites when the scale changes (no rebinding).

Which loss ops get the node: every op of the policy's ``LOSS_OUTPUT`` class (plus
``SoftmaxOutput``, ``LinearRegressionOutput``, ``LogisticRegressionOutput``,
``MAERegressionOutput``, ``MakeLoss`` in any case) that makes its own gradient, i.e. ignores
the gradient of its output. The loss ops that propagate their output's gradient
(:data:`HEAD_GRADIENT_LOSS_OPS`: ``softmax_cross_entropy``, the CTC losses) get their scaled
gradient from downstream: from a ``MakeLoss`` that consumes them, or, at a graph output, from
``out_grads`` passed to ``Module.backward``, which the Module multiplies by ``S``. So every
gradient is scaled exactly once.

The dtypes of parameters behind casts are pinned by the pass itself
(:func:`mxmp._src.graph.symbol_json.pin_variable_dtypes`, called by :func:`mxmp._src.graph.convert.convert_symbol`).
"""
import json

import mxnet as mx

from .symbol_json import MARK, cast_param_names, load
from ..dtypes import MSHADOW_ENUM
from ..policy.policy import LOSS_OUTPUT, Policy

__all__ = ['insert_loss_scale', 'scaled_loss_ops', 'lp_variable_names', 'LOSS_SCALE_NAME',
           'HEAD_GRADIENT_LOSS_OPS', 'NAMED_LOSS_OPS']

#: Name of the input variable (a Module *state*, shape ``(1,)``, float32) holding the scale.
LOSS_SCALE_NAME = '__mxmp_loss_scale__'
#: Loss ops that always get the loss-scale node, whatever the policy says.
NAMED_LOSS_OPS = frozenset(('SoftmaxOutput', 'LinearRegressionOutput',
                            'LogisticRegressionOutput', 'MAERegressionOutput', 'MakeLoss'))
#: Ops of the LOSS_OUTPUT class whose backward multiplies by their output's gradient (MXNet
#: asks for a head gradient when they are a graph output: "head_gradient is required",
#: src/executor/graph_executor.cc). They get no node: their gradient is scaled downstream.
#: tests/test_module.py checks this tuple against MXNet for every LOSS_OUTPUT op.
HEAD_GRADIENT_LOSS_OPS = ('CTCLoss', '_contrib_CTCLoss', '_contrib_ctc_loss', 'ctc_loss',
                          'softmax_cross_entropy')


def scaled_loss_ops(policy):
    """frozenset of str: the ops whose data input gets the loss-scale node under ``policy``.

    Args:
        policy (mxmp.Policy or None): its ``LOSS_OUTPUT`` ops are added to the named loss
            ops and to bfloat16's ``LOSS_OUTPUT`` ops; None: those two only.
    """
    ops = set(NAMED_LOSS_OPS) | set(Policy('bfloat16').ops_in(LOSS_OUTPUT))
    if policy is not None:
        ops |= set(policy.ops_in(LOSS_OUTPUT))
    return frozenset(ops - set(HEAD_GRADIENT_LOSS_OPS))


def insert_loss_scale(sym, loss_ops=None):
    """Put the loss-scale node in front of the data input of every loss op of ``sym``.

    Args:
        sym (mx.sym.Symbol): a graph (float32 or converted by mxmp); it must not hold a
            loss-scale node already.
        loss_ops (iterable of str or None): op names that get the node; default: the
            ``LOSS_OUTPUT`` class of mxmp's op lists plus the five classic loss outputs,
            minus :data:`HEAD_GRADIENT_LOSS_OPS` (see the module docstring).

    Returns:
        tuple ``(symbol, count)``: the new graph, with one extra input variable
        :data:`LOSS_SCALE_NAME` (shape ``(1,)``, float32), and the number of nodes inserted
        (a tensor feeding several loss ops gets one node). The forward outputs of the new graph
        are bit-identical to those of ``sym`` for finite inputs of the loss ops (module
        docstring); the gradient into each loss op's data input is multiplied by the value
        of the variable.

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

    def unique(name):
        base, k = name, 1
        while name in names:
            name, k = '%s%d' % (base, k), k + 1
        names.add(name)
        return name

    def scale_entry(entry, base):
        key = (entry[0], entry[1])
        if key not in scaled:
            if not scale_var:
                scale_var.append(add({'op': 'null', 'name': LOSS_SCALE_NAME, 'inputs': [],
                                      'attrs': {'__shape__': '(1,)',
                                                '__dtype__': MSHADOW_ENUM['float32'],
                                                MARK: 'loss_scale'}}))
            attrs = {MARK: 'loss_scale'}
            stop = add({'op': 'BlockGrad', 'name': unique(base + '_mxmp_stop'),
                        'attrs': dict(attrs), 'inputs': [list(entry)]})
            diff = add({'op': 'elemwise_sub', 'name': unique(base + '_mxmp_zero'),
                        'attrs': dict(attrs), 'inputs': [list(entry), [stop, 0, 0]]})
            mul = add({'op': 'broadcast_mul', 'name': unique(base + '_mxmp_scaled'),
                       'attrs': dict(attrs), 'inputs': [[diff, 0, 0], [scale_var[0], 0, 0]]})
            scaled[key] = add({'op': 'elemwise_add', 'name': unique(base + '_mxmp_loss_scale'),
                               'attrs': dict(attrs), 'inputs': [[stop, 0, 0], [mul, 0, 0]]})
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
    out['arg_nodes'] = [i for i, n in enumerate(nodes) if n['op'] == 'null']
    out.pop('node_row_ptr', None)
    return mx.sym.load_json(json.dumps(out)), len(scaled)


def lp_variable_names(sym):
    """frozenset of str: the variables that ``convert_symbol(cast_params=True)`` stores in the
    target dtype (marked ``cast_param...`` by the pass); the Module keeps float32 master
    weights for them."""
    return cast_param_names(sym)
