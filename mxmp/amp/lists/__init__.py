"""``mxnet.contrib.amp.lists`` for :mod:`mxmp.amp`: contrib.amp's list names, mxmp's op classes.

``symbol_fp16`` and ``symbol_bf16`` hold contrib.amp's module-level names (``FP16_FUNCS`` /
``BF16_FUNCS``, ``FP16_FP32_FUNCS`` / ``BF16_FP32_FUNCS``, ``FP32_FUNCS``,
``WIDEST_TYPE_CASTS``, ``CONDITIONAL_FP32_FUNCS``, ``LOSS_OUTPUT_FUNCTIONS``), derived from
mxmp's own classes (``mxmp/policy/ops_*.py``, :mod:`mxmp._src.policy.tables`), not copied from
contrib.amp. So the membership is mxmp's (e.g. bfloat16's shape and gather ops follow their
inputs here; contrib.amp casts them to float32), and the shape is contrib.amp's:

* every op is in at most one of the lp16, lp16-fp32, fp32, widest-type and conditional lists
  (an op with a conditional rule, e.g. ``Activation``, is listed only there: it follows its
  inputs unless the rule matches);
* ``FP32_FUNCS`` includes the loss outputs, which ``LOSS_OUTPUT_FUNCTIONS`` lists again, as in
  contrib.amp.
"""
from ..._src.dtypes import normalize_dtype
from . import symbol_bf16, symbol_fp16
from ..._src.amp.convert import contrib_lists, module_names

__all__ = ['contrib_lists', 'module_names', 'symbol_fp16', 'symbol_bf16', 'list_lp16_ops',
           'list_fp32_ops', 'list_lp16_fp32_ops', 'list_widest_type_cast',
           'list_conditional_fp32_ops', 'list_loss_output_functions']


def _lists(target_dtype):
    return contrib_lists(normalize_dtype(target_dtype))


def list_lp16_ops(target_dtype):
    """Ops that run in the target dtype (``lists.symbol_*.FP16_FUNCS``/``BF16_FUNCS``), sorted.

    Every op is in at most one of :func:`list_lp16_ops`, :func:`list_fp32_ops`,
    :func:`list_lp16_fp32_ops`, :func:`list_widest_type_cast` and the ops of
    :func:`list_conditional_fp32_ops` (see :mod:`mxmp.amp.lists`).

    Args:
        target_dtype: ``'float16'``/``numpy.float16`` or ``'bfloat16'``/contrib.amp's bfloat16.

    Raises:
        ValueError: another dtype.
    """
    return _lists(target_dtype)['lp16']


def list_fp32_ops(target_dtype):
    """Ops that compute in float32 (mxmp's float32 and loss-output classes), sorted."""
    return _lists(target_dtype)['fp32']


def list_lp16_fp32_ops(target_dtype):
    """Ops that run in whatever dtype their inputs have (mxmp's follow class), sorted."""
    return _lists(target_dtype)['lp16_fp32']


def list_widest_type_cast(target_dtype):
    """Ops whose float inputs are all cast to the widest of their dtypes, sorted."""
    return _lists(target_dtype)['widest']


def list_conditional_fp32_ops(target_dtype):
    """``[(op, attribute, [values])]``: the op computes in float32 for those attribute values
    and follows its inputs otherwise."""
    return _lists(target_dtype)['conditional']


def list_loss_output_functions(target_dtype):
    """Loss-head ops (SoftmaxOutput, MakeLoss, ...); they compute in float32."""
    return _lists(target_dtype)['loss']
