"""contrib.amp's ``lists/symbol_bf16.py`` names for bfloat16, from mxmp's bfloat16 table.

BF16_FUNCS, BF16_FP32_FUNCS, FP32_FUNCS, WIDEST_TYPE_CASTS, CONDITIONAL_FP32_FUNCS and
LOSS_OUTPUT_FUNCTIONS: see :func:`mxmp._src.amp.convert.module_names` for how mxmp's classes map to them.
"""
from ..._src.amp.convert import module_names

globals().update(module_names('bfloat16'))
del module_names
