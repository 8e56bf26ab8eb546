"""The pass's ``cast_moved_params`` rule (:mod:`.plan`): parameters that reach low-precision ops
only through ops that move values without arithmetic are stored in the target dtype.
"""
from ..policy.policy import FLOAT32, LOSS_OUTPUT, LOW_PRECISION

__all__ = ['MOVE_OPS', 'moved_to_low']

#: Ops that move values without arithmetic, exact in bfloat16 forward and backward on MXNet
#: 1.9.1's kernels (tests/graph/test_moved_params.py; not ``transpose``: its bfloat16 kernel
#: corrupts the heap). GluonNLP's BERT concatenates its query/key/value weights and biases
#: through them before one FullyConnected.
MOVE_OPS = frozenset(['Reshape', 'Concat', 'stack', 'expand_dims'])


def moved_to_low(graph):
    """Names (sorted list of str) of the float32 parameters whose every path to a consumer runs
    through :data:`MOVE_OPS` nodes of parameters (or such nodes) alone into low-precision inputs;
    a fixed point that drops candidates until each qualifies. ``graph``: the plan's ``_Graph``
    (its nodes, users, classes, inputs and ``wants_low``/``cast_takes_low``)."""
    nodes, users = graph.nodes, graph.users
    params = {i for i, n in enumerate(nodes) if n['op'] == 'null' and users[i] and
              n['name'] not in graph.data_names and n['name'] not in graph.input_dtypes and
              graph.orig.get((i, 0)) == 'float32'}
    moves = {i for i, n in enumerate(nodes) if n['op'] in MOVE_OPS and graph.n_outputs(i) == 1
             and graph.classes[i][0] not in (LOW_PRECISION, FLOAT32, LOSS_OUTPUT)
             and i not in graph.heads}   # a graph output stays float32
    keep, changed = params | moves, True
    while changed:
        live = keep & moves
        drop = {i for i in keep if not all(graph.wants_low(c, p) or graph.cast_takes_low(c) or
                                           c in live for c, p in users[i])
                or (i in moves and not all(src in keep for src, _, _ in nodes[i]['inputs']))}
        keep, changed = keep - drop, bool(drop)
    return sorted(nodes[i]['name'] for i in keep & params if any(c in moves for c, _ in users[i]))
