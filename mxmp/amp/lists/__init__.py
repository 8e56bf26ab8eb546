"""``mxnet.contrib.amp.lists`` for :mod:`mxmp.amp`: contrib.amp's list names, derived from mxmp's
op classes (not copied from contrib.amp). Every op is in at most one of the lp16, lp16-fp32,
fp32, widest-type and conditional lists; ``FP32_FUNCS`` includes the loss outputs, which
``LOSS_OUTPUT_FUNCTIONS`` lists again, as in contrib.amp.
"""
from . import symbol_bf16, symbol_fp16
from ..._src.amp.lists import contrib_lists, module_names

__all__ = ['contrib_lists', 'module_names', 'symbol_fp16', 'symbol_bf16', 'list_lp16_ops',
           'list_fp32_ops', 'list_lp16_fp32_ops', 'list_widest_type_cast',
           'list_conditional_fp32_ops', 'list_loss_output_functions']


def list_lp16_ops(target_dtype):
    """Ops that run in ``target_dtype`` (float16 or bfloat16, any spelling), sorted; every
    ``list_*`` function raises ValueError for another dtype."""
    return contrib_lists(target_dtype)['lp16']


def list_fp32_ops(target_dtype):
    """Ops that compute in float32 (mxmp's float32 and loss-output classes), sorted."""
    return contrib_lists(target_dtype)['fp32']


def list_lp16_fp32_ops(target_dtype):
    """Ops that run in whatever dtype their inputs have (mxmp's follow class), sorted."""
    return contrib_lists(target_dtype)['lp16_fp32']


def list_widest_type_cast(target_dtype):
    """Ops whose float inputs are all cast to the widest of their dtypes, sorted."""
    return contrib_lists(target_dtype)['widest']


def list_conditional_fp32_ops(target_dtype):
    """``[(op, attribute, [values])]``: the op computes in float32 for those attribute values
    and follows its inputs otherwise."""
    return contrib_lists(target_dtype)['conditional']


def list_loss_output_functions(target_dtype):
    """Loss-head ops (SoftmaxOutput, MakeLoss, ...); they compute in float32."""
    return contrib_lists(target_dtype)['loss']
