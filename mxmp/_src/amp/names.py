"""contrib.amp's list names computed from mxmp's op classes (see :mod:`mxmp.amp.lists`)."""
from ..policy.tables import classes_for

__all__ = ['contrib_lists', 'module_names']


def contrib_lists(target_dtype):
    """contrib.amp's lists for ``'float16'`` or ``'bfloat16'``, from mxmp's op classes.

    Returns:
        dict with keys ``'lp16'``, ``'lp16_fp32'``, ``'fp32'``, ``'widest'`` (sorted lists of op
        names), ``'conditional'`` (sorted list of ``(op, attribute, sorted list of values)``)
        and ``'loss'`` (sorted list of loss-output op names). A new dict on every call.

    Raises:
        ValueError: another dtype name.
    """
    classes = classes_for(target_dtype)
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
    """The module-level names of contrib.amp's ``lists/symbol_fp16.py`` or ``symbol_bf16.py``.

    ``symbol_fp16`` and ``symbol_bf16`` are this dict for their dtype.

    Args:
        target_dtype (str): ``'float16'`` or ``'bfloat16'``.

    Returns:
        dict: ``FP16_FUNCS``/``BF16_FUNCS`` (ops that run in the target dtype: mxmp's
        LOW_PRECISION class), ``FP16_FP32_FUNCS``/``BF16_FP32_FUNCS`` (ops that run in the dtype
        of their inputs: FOLLOW), ``FP32_FUNCS`` (FLOAT32 and LOSS_OUTPUT), ``WIDEST_TYPE_CASTS``
        (float inputs cast to the widest of their dtypes: WIDEST_TYPE),
        ``CONDITIONAL_FP32_FUNCS`` ((op, attribute, values): float32 for those values, else
        follows) and ``LOSS_OUTPUT_FUNCTIONS`` (loss heads, also in FP32_FUNCS): sorted lists
        as :func:`contrib_lists` gives them.

    Raises:
        ValueError: another dtype name.
    """
    lists = contrib_lists(target_dtype)
    prefix = {'float16': 'FP16', 'bfloat16': 'BF16'}[target_dtype]
    return {prefix + '_FUNCS': lists['lp16'], prefix + '_FP32_FUNCS': lists['lp16_fp32'],
            'FP32_FUNCS': lists['fp32'], 'WIDEST_TYPE_CASTS': lists['widest'],
            'CONDITIONAL_FP32_FUNCS': lists['conditional'], 'LOSS_OUTPUT_FUNCTIONS': lists['loss']}
