"""Operator classes per target dtype and the rules that exclude operators from classification.

``float16.py`` and ``bfloat16.py`` hold the classes (data only, see their docstrings for the
sources: MXNet 1.9.1 source files, NVIDIA's "Training with Mixed Precision" guide, Micikevicius
et al., "Mixed Precision Training", ICLR 2018). Every name in
``mx.operator.get_all_registered_operators()`` (1167 in MXNet 1.9.1) is either in exactly one
class of each module or matched by one of the rules below; tests/test_lists.py enforces it.

Aliases: MXNet registers aliases as separate names (``_plus``, ``_Plus`` and ``_add`` for
``elemwise_add``). A Symbol's JSON always names the canonical operator, so the graph pass sees
canonical names; the lists still classify every alias, and all names of one operator share a
class. An op that is in no class at run time (a custom op) is treated as float32 by the pass.
"""

from . import bfloat16, float16

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

#: Names of the module-level data in float16.py and bfloat16.py.
OP_CLASSES = ('LOW_PRECISION', 'FLOAT32', 'LOSS_OUTPUT', 'WIDEST_TYPE', 'FOLLOW')

_MODULES = {'float16': float16, 'bfloat16': bfloat16}


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
        not excluded (it is then expected in one class of each list module).
    """
    if any(op_name == name for name, _ in NOT_EXCLUDED):
        return None
    for prefix, reason in EXCLUDED_PREFIXES:
        if op_name.startswith(prefix):
            return reason
    return None


def classes_for(target_dtype):
    """The operator classes for one target dtype.

    Parameters
    ----------
    target_dtype : str
        ``'float16'`` or ``'bfloat16'`` (normalize other spellings with
        ``mxmp.policy.normalize_dtype`` first).

    Returns
    -------
    dict
        ``'LOW_PRECISION'``, ``'FLOAT32'``, ``'LOSS_OUTPUT'``, ``'WIDEST_TYPE'``, ``'FOLLOW'``:
        frozenset of op names. ``'CONDITIONAL_FLOAT32'``: ``{op: {attr: frozenset(values)}}``
        (the op is FLOAT32 when its attr has one of the values). ``'FLOAT32_INPUTS'`` and
        ``'INDEX_INPUTS'``: ``{op: tuple of input positions}``. ``'EMULATE_FLOAT32'``:
        ``{op: reason}``, ops that compute in float32 when the graph is emulated (empty when the
        module has none). A new dict on every call.

    Raises
    ------
    ValueError
        If target_dtype is not one of the two names.
    """
    module = _MODULES.get(target_dtype) if isinstance(target_dtype, str) else None
    if module is None:
        raise ValueError('target dtype must be "float16" or "bfloat16", got %r' % (target_dtype,))
    classes = {name: frozenset(getattr(module, name)) for name in OP_CLASSES}
    conditional = {}
    for op, attr, values in module.CONDITIONAL_FLOAT32:
        conditional.setdefault(op, {})[attr] = frozenset(values)
    classes['CONDITIONAL_FLOAT32'] = conditional
    classes['FLOAT32_INPUTS'] = dict(module.FLOAT32_INPUTS)
    classes['INDEX_INPUTS'] = dict(module.INDEX_INPUTS)
    classes['EMULATE_FLOAT32'] = dict(getattr(module, 'EMULATE_FLOAT32', {}))
    return classes
