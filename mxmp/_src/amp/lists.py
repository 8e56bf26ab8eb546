"""contrib.amp's (MXNet 1.9.1) op lists: what a convert call's lists mean as an
:class:`mxmp.Policy` (:func:`policy_for`), and the lists computed from mxmp's op classes."""
from ..dtypes import normalize_dtype
from ..errors import AmpListConflict
from ..policy.policy import Policy
from ..policy.tables import classes_for

__all__ = ['policy_for', 'check_lists', 'contrib_lists', 'module_names']


def policy_for(dtype, lp_ops, fp32_ops, conditional, excluded_names=(), init_lp=(), init_fp32=(),
               init_conditional=()):
    """The Policy of a convert call, with contrib.amp's meaning of the op lists: a list given
    (not None) *replaces* its default (``lp_ops``, ``fp32_ops``: tuples of op names;
    ``conditional``: ``(op, attr, values)`` rules); None takes the default plus what
    :func:`mxmp.amp.init` recorded (``init_*``). A default op the given lists leave out follows
    its data, its parameters stored in the data's dtype (``follow_params``).

    Raises:
        AmpListConflict: see :func:`check_lists`.
    """
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
                  excluded_names=excluded_names, follow_ops=follow,
                  conditional_fp32=rules, follow_params=True)


def check_lists(dtype, lp, fp32, cond_ops, defaults):
    """contrib.amp's checks of the effective op sets ``lp``, ``fp32``, ``cond_ops`` of
    ``dtype``; ``defaults`` (3 bools) says which are the default lists, for the message.

    Raises:
        AmpListConflict: an op in two lists; a widest-type or unregistered op in a list.
    """
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


def contrib_lists(target_dtype):
    """contrib.amp's lists of ``target_dtype`` (any spelling of float16 or bfloat16, else
    ValueError) from mxmp's op classes: a new dict of sorted lists ``'lp16'``, ``'lp16_fp32'``,
    ``'fp32'``, ``'widest'``, ``'loss'`` (op names) and ``'conditional'`` (``(op, attribute,
    sorted values)``)."""
    classes = classes_for(normalize_dtype(target_dtype))
    rules = classes['CONDITIONAL_FLOAT32']
    conditional = sorted((op, attr, sorted(values)) for op, attrs in rules.items()
                         for attr, values in attrs.items())
    cond_ops = set(rules)

    def listed(*names):
        return sorted(set().union(*(classes[n] for n in names)) - cond_ops)

    return {'lp16': listed('LOW_PRECISION'), 'lp16_fp32': listed('FOLLOW'),
            'fp32': listed('FLOAT32', 'LOSS_OUTPUT'), 'widest': listed('WIDEST_TYPE'),
            'conditional': conditional, 'loss': sorted(classes['LOSS_OUTPUT'])}


def module_names(target_dtype):
    """The module-level names of contrib.amp's ``lists/symbol_fp16.py`` (``target_dtype``
    float16) or ``symbol_bf16.py``: ``FP16_FUNCS``/``BF16_FUNCS`` (LOW_PRECISION),
    ``*_FP32_FUNCS`` (FOLLOW), ``FP32_FUNCS`` (FLOAT32, LOSS_OUTPUT), ``WIDEST_TYPE_CASTS``,
    ``CONDITIONAL_FP32_FUNCS``, ``LOSS_OUTPUT_FUNCTIONS``, from :func:`contrib_lists`.
    """
    lists = contrib_lists(target_dtype)
    prefix = {'float16': 'FP16', 'bfloat16': 'BF16'}[target_dtype]
    return {prefix + '_FUNCS': lists['lp16'], prefix + '_FP32_FUNCS': lists['lp16_fp32'],
            'FP32_FUNCS': lists['fp32'], 'WIDEST_TYPE_CASTS': lists['widest'],
            'CONDITIONAL_FP32_FUNCS': lists['conditional'], 'LOSS_OUTPUT_FUNCTIONS': lists['loss']}
