"""contrib.amp's meaning of the op lists of the convert calls, as an :class:`mxmp.Policy`.

``mxnet.contrib.amp.convert_symbol`` (MXNet 1.9.1) takes ``target_dtype_ops``, ``fp32_ops`` and
``conditional_fp32_ops``: each given list replaces its default, the lists must be disjoint and
hold only ops some list can take, and an op in no list runs in its data's dtype. This module
turns those arguments into a Policy for mxmp's pass (``follow_ops``, ``conditional_fp32``,
``follow_params``), and casts parameter arrays to the dtypes a converted graph declares.
"""

import numpy as np

from ..errors import AmpListConflict


def policy_for(dtype, lp_ops, fp32_ops, conditional, excluded_names=(), emulate=False,
               init_lp=(), init_fp32=(), init_conditional=()):
    """The Policy of a convert call, with contrib.amp's meaning of the op lists.

    As in ``mxnet.contrib.amp.convert_symbol`` (MXNet 1.9.1), a list given to the call
    *replaces* its default: ``lp_ops`` is then exactly the set of ops run in the target dtype,
    ``fp32_ops`` exactly the float32 ops (loss outputs stay float32 whatever it says),
    ``conditional`` exactly the conditional rules. A default op that the given lists leave out
    follows its data, its parameters stored in the data's dtype (``follow_params``).

    Args:
        dtype (str): ``'float16'`` or ``'bfloat16'``.
        lp_ops, fp32_ops (tuple of str or None): the call's lists; None: the default list plus
            ``init_lp`` / ``init_fp32`` (what :func:`mxmp.amp.init` recorded).
        conditional (tuple of (str, str, tuple of str)) or None: the call's rules; None: the
            default rules plus ``init_conditional``.
        excluded_names (iterable of str): node names kept in float32.
        emulate (bool): see :class:`mxmp.Policy`.

    Returns:
        mxmp.Policy

    Raises:
        AmpListConflict: see :func:`check_lists`.
    """
    from ..policy.tables import classes_for
    from ..policy.policy import Policy
    from .names import contrib_lists
    classes = classes_for(dtype)
    base_lp, base_fp32 = set(classes['LOW_PRECISION']), set(classes['FLOAT32'])
    init_lp, init_fp32 = set(init_lp), set(init_fp32)
    lp = (base_lp - init_fp32) | init_lp if lp_ops is None else set(lp_ops)
    fp32 = (base_fp32 - init_lp) | init_fp32 if fp32_ops is None else set(fp32_ops)
    if conditional is None:
        rules = tuple((op, attr, tuple(values)) for op, attr, values
                      in contrib_lists(dtype)['conditional']) + tuple(init_conditional)
    else:
        rules = tuple(conditional)
    check_lists(dtype, lp, fp32, {op for op, _, _ in rules},
                (lp_ops is None, fp32_ops is None, conditional is None))
    follow = ((base_lp - lp) | (base_fp32 - fp32)) - lp - fp32
    return Policy(dtype, lp_ops=lp - base_lp, fp32_ops=fp32 - base_fp32 - classes['LOSS_OUTPUT'],
                  excluded_names=excluded_names, emulate=emulate, follow_ops=follow,
                  conditional_fp32=rules, follow_params=True)


def check_lists(dtype, lp, fp32, cond_ops, defaults):
    """contrib.amp's checks of the three op lists: disjoint, and only ops a list can take.

    Args:
        dtype (str): the target dtype.
        lp, fp32, cond_ops (set of str): the effective low-precision, float32 and conditional
            op names.
        defaults (tuple of 3 bool): which of the three lists are the defaults (for the message).

    Raises:
        AmpListConflict: an op in two lists; a widest-type op (``elemwise_add``, ...) or an
            unregistered name in a list. The message names the ops and lists.
    """
    from .names import contrib_lists
    named = {'target_dtype_ops': lp, 'fp32_ops': fp32, 'conditional_fp32_ops': cond_ops}
    default = dict(zip(named, defaults))
    for a, b in (('target_dtype_ops', 'fp32_ops'), ('target_dtype_ops', 'conditional_fp32_ops'),
                 ('fp32_ops', 'conditional_fp32_ops')):
        common = sorted(named[a] & named[b])
        if common:
            note = ''.join('; %s was not given, so it is the default list' % n
                           for n in (a, b) if default[n])
            raise AmpListConflict(
                'Ops cannot be in two or more lists: %s in both %s and %s%s. Put each op in '
                'one list.' % (', '.join(common), a, b, note))
    lists = contrib_lists(dtype)
    allowed = set(lists['lp16']) | set(lists['lp16_fp32']) | set(lists['fp32']) | {
        op for op, _, _ in lists['conditional']}
    for name, ops in named.items():
        illegal = sorted(ops - allowed)
        if illegal:
            widest = sorted(set(illegal) & set(lists['widest']))
            why = ('%s cast all their inputs to the widest dtype among them '
                   '(amp.list_widest_type_cast), which no list changes' % ', '.join(widest)
                   if widest else 'MXNet registers no op named %s' % ', '.join(illegal))
            raise AmpListConflict('%s cannot take %s: %s. Choose ops from amp.list_lp16_ops, '
                                  'amp.list_fp32_ops, amp.list_lp16_fp32_ops or '
                                  'amp.list_conditional_fp32_ops.'
                                  % (name, ', '.join(illegal), why))


def cast_to_graph(sym, params):
    """A new dict: each array cast to its variable's ``__dtype__`` in ``sym`` (if it has one).

    Args:
        sym (Symbol): a converted graph.
        params (dict of str -> NDArray): arrays named as the graph's variables.
    """
    import mxnet as mx
    from ..dtypes import from_mshadow_enum, mx_dtype
    from ..graph.symbol_json import FLOAT_DTYPES, load
    from ..layout import to_default_layout
    wanted = {n['name']: from_mshadow_enum(n.get('attrs', {}).get('__dtype__'))
              for n in load(sym)['nodes'] if n['op'] == 'null'}
    out = {}
    for name, value in params.items():
        dtype = wanted.get(name)
        if dtype in FLOAT_DTYPES and np.dtype(value.dtype) != np.dtype(mx_dtype(dtype)):
            to_default_layout([value])   # amp_cast fails on weights oneDNN reordered in place
            value = mx.nd.amp_cast(value, dtype=mx_dtype(dtype))
        out[name] = value
    return out
