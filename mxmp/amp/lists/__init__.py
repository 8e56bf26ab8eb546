"""``mxnet.contrib.amp.lists`` for :mod:`mxmp.amp`: contrib.amp's list names, mxmp's op classes.

``symbol_fp16`` and ``symbol_bf16`` hold contrib.amp's module-level names (``FP16_FUNCS`` /
``BF16_FUNCS``, ``FP16_FP32_FUNCS`` / ``BF16_FP32_FUNCS``, ``FP32_FUNCS``,
``WIDEST_TYPE_CASTS``, ``CONDITIONAL_FP32_FUNCS``, ``LOSS_OUTPUT_FUNCTIONS``), derived from
mxmp's own classes (``mxmp/lists/float16.py``, ``mxmp/lists/bfloat16.py``), not copied from
contrib.amp. So the membership is mxmp's (e.g. bfloat16's shape and gather ops follow their
inputs here; contrib.amp casts them to float32), and the shape is contrib.amp's:

* every op is in at most one of the lp16, lp16-fp32, fp32, widest-type and conditional lists
  (an op with a conditional rule, e.g. ``Activation``, is listed only there: it follows its
  inputs unless the rule matches);
* ``FP32_FUNCS`` includes the loss outputs, which ``LOSS_OUTPUT_FUNCTIONS`` lists again, as in
  contrib.amp.
"""
from ...lists import classes_for

__all__ = ['contrib_lists', 'symbol_fp16', 'symbol_bf16']


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


from . import symbol_bf16, symbol_fp16  # noqa: E402  (they call contrib_lists)
