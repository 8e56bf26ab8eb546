"""contrib.amp's ``lists/symbol_bf16.py`` names for bfloat16.

Derived from ``mxmp/lists/bfloat16.py``.

See :mod:`mxmp.amp.lists` for how mxmp's classes map to these lists.
"""
from . import contrib_lists

_LISTS = contrib_lists('bfloat16')

#: Ops that run in bfloat16 (mxmp's LOW_PRECISION class).
BF16_FUNCS = _LISTS['lp16']
#: Ops that run in the dtype of their inputs (mxmp's FOLLOW class).
BF16_FP32_FUNCS = _LISTS['lp16_fp32']
#: Ops that compute in float32 (mxmp's FLOAT32 and LOSS_OUTPUT classes).
FP32_FUNCS = _LISTS['fp32']
#: Ops whose float inputs are cast to the widest of their dtypes (mxmp's WIDEST_TYPE class).
WIDEST_TYPE_CASTS = _LISTS['widest']
#: (op, attribute, values): the op computes in float32 for those values, else follows.
CONDITIONAL_FP32_FUNCS = _LISTS['conditional']
#: Loss heads; they compute in float32 (also in FP32_FUNCS).
LOSS_OUTPUT_FUNCTIONS = _LISTS['loss']
