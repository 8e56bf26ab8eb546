"""What :func:`mxmp.explain` says of the pass's rewriting rules (the kernel rule, the reduction
rule) next to the user's op lists: the user's choice first where the user named a node's op,
and, where the user's class made a rule leave a node, that rule and why.
"""
from ..policy.policy import FLOAT32, FOLLOW, LOW_PRECISION
from .kernel_rule import SUBSTITUTES, original_op, rule_of, substitution_rule

__all__ = ['rewritten_class', 'with_user_choice', 'rules_left']


def rewritten_class(policy, node, kernel_nodes):
    """``(FLOAT32, rule)`` of a node (graph JSON) the kernel or reduction rule wrote, or that
    the kernel rule would write (``kernel_nodes``: ``{node name: library op}``, explain's);
    ``(LOW_PRECISION, rule)`` of the residual rule's identity; None for other nodes. The
    kernel and reduction rules' nodes compute in float32."""
    from . import reduce_rule, residual_rule   # loaded by the first conversion
    if residual_rule.rule_of(node) is not None:   # an identity in the target dtype
        return LOW_PRECISION, residual_rule.rule_of(node)
    if rule_of(node) is not None:
        return FLOAT32, with_user_choice(policy, node, original_op(node), rule_of(node))
    if node['op'] != 'null' and node['name'] in kernel_nodes:
        return FLOAT32, with_user_choice(policy, node, node['op'], substitution_rule(
            node['op'], kernel_nodes[node['name']]))
    if reduce_rule.rule_of(node) is not None:
        return FLOAT32, with_user_choice(policy, node, node['op'], reduce_rule.rule_of(node))
    return None


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
    if op_class in (LOW_PRECISION, FOLLOW) and node['op'] in SUBSTITUTES and \
            policy.kernels != 'mxnet':
        rule += ("; the kernel rule keeps MXNet's %s (mxmp's %s computes in float32 only)"
                 % (node['op'], SUBSTITUTES[node['op']]))
    elif op_class in (LOW_PRECISION, FOLLOW) and node['op'] in ('sum', 'mean') and \
            policy.reductions != 'mxnet':
        rule += "; the reduction rule keeps MXNet's %s (the user's class)" % node['op']
    return decision[0], rule
