"""The pass's residual rule: with ``Policy(residual_dtype='target')``, a LayerNorm's output is
cast to the target dtype once, right after the LayerNorm, and its consumers read that tensor.

Why: in a post-LayerNorm transformer (BERT, ``x = LayerNorm(x + Dropout(f(x)))``) the
LayerNorm's output is the residual stream: it feeds the next block's matrix products and its
residual add. By default it stays float32 (MXNet's LayerNorm is in the float32 class; mxmp's
library LayerNorm of the kernel rule follows its data, which is the float32 sum), the products
cast it down and the add runs in float32 (widest type) with the bfloat16 branch cast up. With
the rule the stream is held in the target dtype (half the bytes): the add reads two
target-dtype tensors and runs in it (MXNet's ``elemwise_add``, oneDNN's sum), and the next
LayerNorm reads it: the library LayerNorm then takes the target dtype (statistics in float32
inside the kernel, output rounded once) and its output stays in the target dtype, so after
the first block no cast is left on the stream; MXNet's float32 LayerNorm casts its input up.
Values read by the matrix products are the same as by default (the same one rounding); the
residual add differs by rounding its operands and result to the target dtype. In a
pre-LayerNorm transformer (GPT) a LayerNorm's output feeds matrix products only, so the rule
moves the cast without changing a value (docs/accuracy.md, "The residual stream in bfloat16").

Which nodes: output 0 of every LayerNorm that computes in float32 (``LayerNorm`` in the
float32 class, or the kernel rule's library LayerNorm) and whose data is float32 in the float32
graph gets one identity (``_copy``, marked :data:`RESIDUAL_MARK`) planned as a low-precision
op: the pass casts the LayerNorm's output to the target dtype for it (one ``amp_cast``, none
where the LayerNorm's output already is in the target dtype) and it passes that on (MXNet
runs it in place: no copy, no memory). Every consumer reads it except graph outputs (they stay
float32), consumers that compute in float32 (the float32 and loss-output classes, the kernel
and reduction rules' float32 nodes; the library's LayerNorm, softmax and Dropout follow their
data and do read it), binary broadcast ops (MXNet 1.9.1's bfloat16 ``broadcast_add`` is a
scalar loop, :func:`_slow_in_target`) and consumers with another input written by a node that
computes in float32 (MXNet's float32 Dropout: a widest-type add would cast the tensor back up),
which keep reading the float32 output. (An identity rather than the cast itself: the plan types
the graph as float32 first.)

On by default (``residual_dtype='target'``; ``'float32'`` turns it off): docs/accuracy.md gives the post-LayerNorm
study, its casts, speed and memory on BERT. :func:`mxmp.explain` names the rule on the identity
(:func:`.rule_notes.residual_rule_of`); :func:`mxmp.remove_casts` and export drop it with mxmp's casts.
"""
from ..policy.policy import FLOAT32, LOSS_OUTPUT
from .kernel_rule import original_op, planned
from .rule_notes import RESIDUAL_MARK, rewritten_class
from .symbol_json import MARK, infer_dtypes, unique_name

__all__ = ['substitute']


def _is_float32_layernorm(policy, node):
    if original_op(node) == 'LayerNorm':   # the kernel rule's library LayerNorm: float32
        return True
    return node['op'] == 'LayerNorm' and policy.classify(
        'LayerNorm', node.get('attrs', {}), node['name'])[0] == FLOAT32


def _computes_float32(policy, node, kernel_nodes):
    if node['op'] == 'null':
        return False
    rewritten = rewritten_class(policy, node, kernel_nodes)
    if rewritten is not None:   # a node another rule wrote (or would write: explain's graph)
        return rewritten[0] in (FLOAT32, LOSS_OUTPUT)   # library ops follow their data
    if node.get('attrs', {}).get(MARK) is not None:
        return True   # another mxmp node (an accumulation copy, a cast): float32
    return policy.classify(node['op'], node.get('attrs', {}), node['name'])[0] in (
        FLOAT32, LOSS_OUTPUT)


def _slow_in_target(node):
    """MXNet 1.9.1's binary broadcast ops (broadcast_add, ...) run a scalar loop in bfloat16:
    broadcast_add of two (128, 8, 768) tensors took 49 ms against 0.23 ms for elemwise_add
    (oneDNN's sum) on one Zen 4 core (docs/accuracy.md, "The residual stream in bfloat16")."""
    return node['op'].startswith('broadcast_') and len(node['inputs']) > 1


def _reads_float32(policy, nodes, node, src, kernel_nodes):
    """Whether consumer ``node`` keeps reading LayerNorm ``src``'s float32 output: it
    computes in float32, it is a binary broadcast op (:func:`_slow_in_target`), or another of
    its inputs is written by a node that computes in float32 (a widest-type add of a float32
    op's output would cast the target-dtype tensor back up: one more cast, one more
    rounding). A library op of the kernel rule (Dropout, LayerNorm, softmax) follows its
    data's dtype: after a low-precision op it writes the target dtype."""
    return _computes_float32(policy, node, kernel_nodes) or _slow_in_target(node) or any(
        s != src and _computes_float32(policy, nodes[s], kernel_nodes)
        for s, _, _ in node['inputs'])


def substitute(js, policy, input_dtypes):
    """``js`` (graph JSON) with the rule applied (module docstring): a new dict, or ``js``
    itself where the policy leaves it off or nothing applies. ``input_dtypes``: ``{input
    name: dtype}`` as :func:`infer_dtypes` takes them (low precision read as float32)."""
    if policy.residual_dtype != 'target':
        return js
    nodes = js['nodes']
    kernel_nodes = planned(js, policy)   # explain's graph: the kernel rule's nodes to come
    from .ln_copy import COPY, has_copy   # the kernel rule's LayerNorm copy: output 3 too
    chosen = {}   # (LayerNorm nid, output) -> consumer (nid, input position) list of the cast
    for nid, node in enumerate(nodes):
        for pos, (src, out, _) in enumerate(node.get('inputs', ())):
            if (out == 0 or out == COPY and has_copy(nodes[src])) and \
                    nodes[src]['op'] != 'null' and \
                    _is_float32_layernorm(policy, nodes[src]) and \
                    not _reads_float32(policy, nodes, node, src, kernel_nodes):
                chosen.setdefault((src, out), []).append((nid, pos))
    if chosen:
        dtypes = infer_dtypes(js, input_dtypes)
        chosen = {key: uses for key, uses in chosen.items() if dtypes.get(key) == 'float32'}
    if not chosen:
        return js
    names = {n['name'] for n in nodes}
    rewired = {use for uses in chosen.values() for use in uses}
    out, new_id, cast_of = [], {}, {}
    for nid, node in enumerate(nodes):
        inputs = [[cast_of[(s, i)], 0, v] if (nid, pos) in rewired else [new_id[s], i, v]
                  for pos, (s, i, v) in enumerate(node['inputs'])]
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
        for idx in (0, COPY):   # output 0, and a LayerNorm copy's copy (its own identity)
            if (nid, idx) in chosen:
                out.append({'op': '_copy', 'name': unique_name(
                    node['name'] + ('_residual' if idx == 0 else '_copy_residual'), names),
                    'inputs': [[new_id[nid], idx, 0]], 'attrs': {MARK: RESIDUAL_MARK}})
                cast_of[(nid, idx)] = len(out) - 1
    # a rewired input reads the identity's output 0, as it read the LayerNorm's output
    return dict(js, nodes=out, heads=[[new_id[s], i, v] for s, i, v in js['heads']])

