"""contrib.amp's ``lists/symbol_bf16.py`` names for bfloat16, from mxmp's bfloat16 table.

BF16_FUNCS, BF16_FP32_FUNCS, FP32_FUNCS, WIDEST_TYPE_CASTS, CONDITIONAL_FP32_FUNCS and
LOSS_OUTPUT_FUNCTIONS: :func:`mxmp._src.amp.lists.module_names` maps mxmp's classes to them.
"""
from ..._src.amp.lists import module_names

globals().update(module_names('bfloat16'))
del module_names
