"""The rules that leave registered operators out of classification.

Every name in ``mx.operator.get_all_registered_operators()`` (1167 in MXNet 1.9.1) is either in
exactly one class of each target dtype's table (:mod:`mxmp._src.policy.tables`) or matched by one of
the rules below; tests/test_lists.py enforces it.

Aliases: MXNet registers aliases as separate names (``_plus``, ``_Plus`` and ``_add`` for
``elemwise_add``). A Symbol's JSON always names the canonical operator, so the graph pass sees
canonical names; the tables still classify every alias, and all names of one operator share a
class. An op that is in no class at run time (a custom op) is treated as float32 by the pass.
"""

__all__ = ['EXCLUDED_PREFIXES', 'NOT_EXCLUDED', 'excluded_reason']

#: (prefix, reason): registered names starting with the prefix are not classified.
EXCLUDED_PREFIXES = (
    ('_backward_', 'gradient op: created by autograd or the executor from a forward op, never '
                   'part of a forward Symbol; it runs in the dtype its forward op chose'),
    ('_contrib_backward_', 'gradient op of a contrib op (as _backward_)'),
    ('_np_', 'numpy-interface op (mx.np): mxmp converts legacy mx.sym / Gluon graphs, not '
             'numpy-mode (npx.set_np) graphs, like contrib.amp in MXNet 1.9.1'),
    ('_npi_', 'numpy-interface internal op (mx.np): not converted, as _np_'),
    ('_npx_', 'numpy-extension op (mx.npx): not converted, as _np_; the legacy operators among '
              'them (_npx_activation for Activation, ...) are aliases whose canonical name is '
              'classified'),
    ('amp_', 'mixed-precision cast op (amp_cast, amp_multicast): inserted and managed by the '
             'graph pass itself'),
)

#: (name, reason): names that a prefix rule would exclude but that are classified.
NOT_EXCLUDED = (
    ('_np_cumsum', 'canonical name of the legacy cumsum operator (cumsum is registered as its '
                   'alias), so legacy graphs name it in their JSON'),
)


def excluded_reason(op_name):
    """Why an operator is left out of classification.

    Parameters
    ----------
    op_name : str
        A registered operator name, e.g. ``'_backward_Convolution'``.

    Returns
    -------
    str or None
        The reason of the first matching rule in ``EXCLUDED_PREFIXES``, or None when the op is
        not excluded (it is then expected in one class of each target dtype's table).
    """
    if any(op_name == name for name, _ in NOT_EXCLUDED):
        return None
    for prefix, reason in EXCLUDED_PREFIXES:
        if op_name.startswith(prefix):
            return reason
    return None
