"""contrib.amp's ``lists/symbol_fp16.py`` names for float16, from mxmp's float16 table.

FP16_FUNCS, FP16_FP32_FUNCS, FP32_FUNCS, WIDEST_TYPE_CASTS, CONDITIONAL_FP32_FUNCS and
LOSS_OUTPUT_FUNCTIONS: see :func:`mxmp._src.amp.convert.module_names` for how mxmp's classes map to them.
"""
from ..._src.amp.convert import module_names

globals().update(module_names('float16'))
del module_names
