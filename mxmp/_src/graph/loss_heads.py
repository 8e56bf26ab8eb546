"""The loss-scale nodes of a Symbol (:func:`insert_loss_scale`): every gradient that enters the
backward pass is multiplied by the loss scale ``S`` once.

Gradients enter the backward pass at three kinds of places, and each is scaled:

- a loss op that makes its own gradient (``SoftmaxOutput``, ``MakeLoss``...): a *scale node*
  in front of its data input ``x``: ``b = BlockGrad(x)``, ``y = b + (x - b) * S``. Forward,
  ``y`` equals ``x`` bit for bit for finite ``x``; backward, the gradient into ``x`` is the loss
  op's times ``S`` (exact for a power of two).
- an op whose backward mxmp cannot see (:data:`OPAQUE_GRADIENT_OPS`: ``Custom`` ops, whose
  Python backward may ignore the output gradient (``need_top_grad=False``, a loss) or add a
  term of its own, ops that run another graph, ``IdentityAttachKLSparseReg``, and an operator
  library's ops that no op list knows, :func:`opaque_ops`): bracketed. An
  *unscale node* ``y = b + (x - b) / S`` on each of its float outputs that another op reads
  hands it the unscaled gradient, a scale node on each of its float inputs multiplies what it
  returns, own terms included, by ``S``. Any backward that is affine in its output gradient
  (every one) comes out exactly ``S`` times the unscaled one. The bracketed op's backward runs
  on unscaled values: these ops compute in float32 (the policy's subgraph and loss groups,
  unlisted ops), so nothing underflows there.
- a graph output whose gradient the caller passes (``out_grads``): :class:`mxmp.Module`
  multiplies it by ``S``, except for the outputs of bracketed ops (:attr:`LossScaled.raw_heads`),
  whose gradient enters unscaled, as the unscale node would make it.

Loss ops that propagate their output's gradient (:data:`HEAD_GRADIENT_LOSS_OPS`) get no node:
their gradient is scaled downstream. ``S`` is the graph input :data:`LOSS_SCALE_NAME`, which
:class:`mxmp.Module` binds as a state. The ``_mxmp_`` names below are graph node and variable
names, not side channels.
"""
import collections

from .symbol_json import MARK, dump, infer_dtypes, load, mutable_inputs, unique_name
from ..dtypes import MSHADOW_ENUM
from ..policy.policy import LOSS_OUTPUT, Policy
from ..policy.tables import excluded_reason

__all__ = ['insert_loss_scale', 'scaled_loss_ops', 'opaque_ops', 'LossScaled', 'LOSS_SCALE_NAME',
           'HEAD_GRADIENT_LOSS_OPS', 'NAMED_LOSS_OPS', 'OPAQUE_GRADIENT_OPS']

#: Name of the input variable (a Module *state*, shape ``(1,)``, float32) holding the scale.
LOSS_SCALE_NAME = '__mxmp_loss_scale__'   # a graph variable name, not a side channel
#: Loss ops that always get the loss-scale node, whatever the policy says.
NAMED_LOSS_OPS = frozenset(('SoftmaxOutput', 'LinearRegressionOutput',
                            'LogisticRegressionOutput', 'MAERegressionOutput', 'MakeLoss'))
#: LOSS_OUTPUT ops whose backward multiplies by their output's gradient (MXNet asks for a head
#: gradient at a graph output, src/executor/graph_executor.cc): no node.
HEAD_GRADIENT_LOSS_OPS = ('CTCLoss', '_contrib_CTCLoss', '_contrib_ctc_loss', 'ctc_loss',
                          'softmax_cross_entropy')
#: Ops whose backward mxmp cannot see and that may inject a gradient of their own: Python code
#: (``Custom``: a loss with ``need_top_grad=False``, or any term its backward adds), another
#: graph (control flow, cached ops), a regularizer added in the backward pass
#: (``IdentityAttachKLSparseReg``: ``grad = out_grad + penalty * ...``). Bracketed by scale and
#: unscale nodes.
OPAQUE_GRADIENT_OPS = frozenset(('Custom', '_CachedOp', '_CachedOpThreadSafe', '_CustomFunction',
                                 '_NDArray', '_Native', '_cond', '_foreach', '_while_loop',
                                 'IdentityAttachKLSparseReg'))

LossScaled = collections.namedtuple('LossScaled', ['symbol', 'count', 'raw_heads'])
LossScaled.__doc__ = """What :func:`insert_loss_scale` returns: the ``symbol`` with the nodes,
their ``count`` (scale and unscale nodes, one per tensor), and ``raw_heads`` (frozenset of
int): the positions of the graph outputs made by a bracketed op, whose ``out_grads`` must
enter unscaled."""


def scaled_loss_ops(policy):
    """frozenset of the ops whose data input gets the node: :data:`NAMED_LOSS_OPS`, bfloat16's
    and ``policy``'s (or None) ``LOSS_OUTPUT`` ops, minus :data:`HEAD_GRADIENT_LOSS_OPS`."""
    ops = set(NAMED_LOSS_OPS) | set(Policy('bfloat16').ops_in(LOSS_OUTPUT))
    if policy is not None:
        ops |= set(policy.ops_in(LOSS_OUTPUT))
    return frozenset(ops - set(HEAD_GRADIENT_LOSS_OPS))




def opaque_ops(sym, policy):
    """frozenset: :data:`OPAQUE_GRADIENT_OPS` and the ops of ``sym`` that no op list knows
    (in no class of the bfloat16, float16 or ``policy``'s tables, excluded by no prefix: an
    operator library's op, which the pass computes in float32), whose backward mxmp cannot
    see either."""
    known = set()
    for each in (Policy('bfloat16'), Policy('float16'), policy):
        if each is not None:
            for ops in each.classes.values():
                known |= ops
    ops = {n['op'] for n in load(sym)['nodes'] if n['op'] != 'null'} - known
    return OPAQUE_GRADIENT_OPS | frozenset(op for op in ops if excluded_reason(op) is None)


def insert_loss_scale(sym, loss_ops=None, opaque_ops=OPAQUE_GRADIENT_OPS):
    """Scale every gradient that enters the backward pass of ``sym`` (module docstring).

    Args:
        sym (mx.sym.Symbol): a graph (float32 or converted by mxmp), float32 data inputs.
        loss_ops (iterable of str or None): ops whose data input gets a scale node; default
            :func:`scaled_loss_ops` of no policy.
        opaque_ops (iterable of str): ops bracketed by scale and unscale nodes; default
            :data:`OPAQUE_GRADIENT_OPS` (:func:`opaque_ops` adds the graph's unknown ops).

    Returns:
        LossScaled: the graph with the extra input :data:`LOSS_SCALE_NAME` (shape ``(1,)``,
        float32) when ``count`` > 0.

    Raises:
        ValueError: ``sym`` already holds :data:`LOSS_SCALE_NAME`; a bracketed op reads or
            writes a float tensor that is not float32 (the message names the op and the fix).
    """
    if LOSS_SCALE_NAME in sym.list_arguments():
        raise ValueError('the graph already holds the loss-scale input %r; pass the float32 '
                         'graph (mxmp.Module.symbol), not the bound one' % LOSS_SCALE_NAME)
    loss_ops = scaled_loss_ops(None) if loss_ops is None else frozenset(loss_ops)
    js = load(sym)
    old_nodes = js['nodes']
    opaque = {i for i, n in enumerate(old_nodes) if n['op'] in frozenset(opaque_ops)}
    dtypes = infer_dtypes(js, {}) if opaque else {}
    names = {n['name'] for n in old_nodes}
    nodes, remap, made = [], {}, {}
    scale_var = []

    def add(node):
        nodes.append(node)
        return len(nodes) - 1

    def scaling(op, name, inputs):   # node names: graph names, not side channels
        return add({'op': op, 'name': unique_name(name, names), 'attrs': {MARK: 'loss_scale'},
                    'inputs': inputs})

    def node_on(entry, base, kind):
        """``entry`` (new ids) through a scale (``'mul'``) or unscale (``'div'``) node."""
        key = (entry[0], entry[1], kind)
        if key not in made:
            if not scale_var:
                scale_var.append(add({'op': 'null', 'name': LOSS_SCALE_NAME, 'inputs': [],
                                      'attrs': {'__shape__': '(1,)',
                                                '__dtype__': MSHADOW_ENUM['float32'],
                                                MARK: 'loss_scale'}}))
            suffix = '_mxmp_loss_scale' if kind == 'mul' else '_mxmp_loss_unscale'
            stop = scaling('BlockGrad', base + suffix + '_stop', [list(entry)])
            diff = scaling('elemwise_sub', base + suffix + '_zero', [list(entry), [stop, 0, 0]])
            times = scaling('broadcast_' + kind, base + suffix + '_times',
                            [[diff, 0, 0], [scale_var[0], 0, 0]])
            made[key] = scaling('elemwise_add', base + suffix, [[stop, 0, 0], [times, 0, 0]])
        return [made[key], 0, 0]

    def bracketable(old_entry, nid):
        """Whether the tensor ``old_entry`` next to the bracketed node ``nid`` gets a node."""
        dtype = dtypes.get((old_entry[0], old_entry[1]), 'float32')
        if dtype == 'float32':
            return True
        if dtype in ('float16', 'bfloat16', 'float64'):
            node = old_nodes[nid]
            raise ValueError(
                'loss scaling cannot reach the gradient of %s %r: its backward is opaque to '
                'mxmp (it may add a gradient of its own) and it reads or writes %s, not '
                'float32. Keep it float32 (Policy(fp32_ops=[%r]), its default class), or '
                'train without loss scaling (loss_scaler=\'none\')'
                % (node['op'], node['name'], dtype, node['op']))
        return False   # integer tensors carry no gradient

    for old, node in enumerate(old_nodes):
        node = dict(node)
        is_loss = node['op'] in loss_ops
        aux = mutable_inputs(node) if old in opaque else ()   # variables, written in place
        inputs = []
        for k, (src, idx, ver) in enumerate(node.get('inputs', [])):
            entry = [remap[src], idx, ver]
            base = old_nodes[src]['name']
            if src in opaque:   # an output of a bracketed op
                if not (old in opaque or (is_loss and k == 0)) and bracketable([src, idx], src):
                    entry = node_on(entry, base, 'div')
            elif is_loss and k == 0:
                entry = node_on(entry, base, 'mul')
            elif old in opaque and k not in aux and bracketable([src, idx], old):   # weights too
                entry = node_on(entry, base, 'mul')
            inputs.append(entry)
        node['inputs'] = inputs
        remap[old] = add(node)
    out = dict(js)
    out['nodes'] = nodes
    out['heads'] = [[remap[src], idx, ver] for src, idx, ver in js['heads']]
    raw = frozenset(k for k, (src, _, _) in enumerate(js['heads']) if src in opaque)
    return LossScaled(dump(out), len(made), raw if made else frozenset())
