"""What :func:`mxmp.explain` says of the pass's rewriting rules (the kernel rule, the reduction
rule) next to the user's op lists: the user's choice first where the user named a node's op,
and, where the user's class made a rule leave a node, that rule and why.
"""
from ..policy.policy import FLOAT32, FOLLOW, LOW_PRECISION
from .kernel_rule import (ATTENTION, FLAG, INPUT_COPY, KERNEL_PREFIX, SUBSTITUTES, TIE,
                          original_op)
from .symbol_json import MARK, RESIDUAL_MARK

__all__ = ['RESIDUAL_MARK', 'residual_rule_of', 'kernel_rule_of', 'substitution_rule',
           'rewritten_class', 'library_class',
           'with_user_choice', 'rules_left']


def residual_rule_of(node):
    """The explain rule (str) of an identity the residual rule wrote, or None."""
    if node['op'] == '_copy' and node.get('attrs', {}).get(MARK) == RESIDUAL_MARK:
        return ("residual rule: the LayerNorm's output in the target dtype, cast once; its "
                "consumers read it (Policy(residual_dtype='target'))")
    return None


def rewritten_class(policy, node, kernel_nodes):
    """``(op_class, rule)`` of a node (graph JSON) the kernel or reduction rule wrote, or that
    the kernel rule would write (``kernel_nodes``: ``{node name: library op}``, explain's);
    None for other nodes. The library ops follow their data's dtype in bfloat16 graphs, the
    attention matmuls are low precision (:func:`library_class`), their input copies and shape
    ties follow; the residual rule's identity is low precision; the other nodes of the rules
    compute in float32."""
    from . import reduce_rule   # loaded by the first conversion
    if residual_rule_of(node) is not None:   # an identity in the target dtype
        return LOW_PRECISION, residual_rule_of(node)
    if original_op(node) is not None:
        return library_class(policy, node, original_op(node))
    if node['op'] != 'null' and node['name'] in kernel_nodes:
        return library_class(policy, node, node['op'])
    if node['op'] != 'null' and node.get('attrs', {}).get(MARK) in (INPUT_COPY, TIE) and \
            policy.target_dtype == 'bfloat16':   # copies and shape ties: no cast of data
        return FOLLOW, kernel_rule_of(node)
    if kernel_rule_of(node) is not None:
        return FLOAT32, with_user_choice(policy, node, original_op(node), kernel_rule_of(node))
    if reduce_rule.rule_of(node) is not None:
        return FLOAT32, with_user_choice(policy, node, node['op'], reduce_rule.rule_of(node))
    return None


def library_class(policy, node, op):
    """``(op_class, rule)`` of a node the kernel rule runs (or would run) as a library op in
    place of MXNet's ``op``: low precision for the attention matmuls (:data:`ATTENTION`);
    follow (its data's dtype, bfloat16 or float32) for a bfloat16
    target; float32 where the user put ``op`` in ``fp32_ops`` or the node in
    ``excluded_names``, and for other targets."""
    rule = substitution_rule(op, SUBSTITUTES[op], node.get('attrs'))
    if op in ATTENTION:   # bfloat16 products: the kernel rule left the user's classes alone
        return LOW_PRECISION, with_user_choice(policy, node, op, rule)
    mine = policy.classify(op, node.get('attrs', {}), node['name'])
    if 'user override' in mine[1] and mine[0] == FLOAT32:
        return FLOAT32, '%s; %s, in float32' % (mine[1], rule)
    if policy.target_dtype != 'bfloat16':
        return FLOAT32, rule + ', in float32'
    return FOLLOW, rule + (", in its data's dtype (bfloat16 where a low-precision op feeds it; "
                           'float32 arithmetic inside, rounded once)')


def with_user_choice(policy, node, op, rule):
    """``rule`` of a node a rule rewrote, after the user's own choice for it where the user
    named it (``fp32_ops``, ``excluded_names``: float32, as the rewrite computes)."""
    if op is None:
        return rule
    mine = policy.classify(op, node.get('attrs', {}), node['name'])[1]
    return '%s; %s' % (mine, rule) if 'user override' in mine else rule


def rules_left(policy, node, decision):
    """``decision`` (class, rule) of a node the user named in ``lp_ops``/``follow_ops``, with
    the kernel or reduction rule that would have rewritten it and left it to the user's list."""
    op_class, rule = decision
    if 'user override' not in rule or policy.target_dtype != 'bfloat16':
        return decision
    if node['op'] in ATTENTION and op_class in (FLOAT32, FOLLOW) and policy.kernels != 'mxnet':
        rule += ("; the kernel rule keeps MXNet's %s (mxmp's %s computes in bfloat16)"
                 % (node['op'], SUBSTITUTES[node['op']]))
    elif op_class in (LOW_PRECISION, FOLLOW) and node['op'] in SUBSTITUTES and \
            node['op'] not in ATTENTION and policy.kernels != 'mxnet':
        rule += ("; the kernel rule keeps MXNet's %s (the user's class), not mxmp's %s"
                 % (node['op'], SUBSTITUTES[node['op']]))
    elif op_class in (LOW_PRECISION, FOLLOW) and node['op'] in ('sum', 'mean') and \
            policy.reductions != 'mxnet':
        rule += "; the reduction rule keeps MXNet's %s (the user's class)" % node['op']
    return decision[0], rule


def substitution_rule(op, library_op, attrs=None):
    """The explain rule (str) of an ``op`` node the rule runs as ``library_op``; ``attrs``
    (the library node's, optional) name a self-attention pair's part or a LayerNorm copy."""
    if op in ATTENTION:
        from .selfatt_pair import pair_rule_suffix   # with the kernel rule, not by `import mxmp`
        pair = pair_rule_suffix(attrs or {})
        return ("kernel rule: %s as %s, mxmp's library kernel: bfloat16 in and out, float32 "
                "accumulation (Policy(kernels='mxnet') keeps MXNet's float32 op)%s"
                % (op, library_op, pair))
    from .ln_copy import copy_rule_suffix   # with the kernel rule, not by `import mxmp`
    return ("kernel rule: %s as %s, mxmp's library kernel (Policy(kernels='mxnet') keeps "
            "MXNet's)%s" % (op, library_op, '; it reads a training-mode flag the rule adds'
                            if op == 'Dropout' else copy_rule_suffix(attrs or {})))


def kernel_rule_of(node):
    """The explain rule (str) of a node the kernel rule wrote, or None."""
    mark = node.get('attrs', {}).get(MARK, '') if node['op'] != 'null' else ''
    if mark == INPUT_COPY:
        return ("kernel rule: input copy of an mxmp library op (MXNet's copy accumulates "
                "grad_req='add')")
    if mark == TIE:
        return ("kernel rule: shape of an mxmp library op's other inputs, from its data (MXNet's "
                "wrapper of library ops infers data's shape alone)")
    if mark == FLAG:
        return ('kernel rule: training-mode flag of mxmp_dropout (1 in inference, 0 or 2 in '
                'training)')
    if mark.startswith(KERNEL_PREFIX):
        return substitution_rule(original_op(node), node['op'], node.get('attrs'))
    return None
