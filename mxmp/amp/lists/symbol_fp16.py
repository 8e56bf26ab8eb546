"""contrib.amp's ``lists/symbol_fp16.py`` for float16: FP16_FUNCS, FP16_FP32_FUNCS, FP32_FUNCS,
WIDEST_TYPE_CASTS, CONDITIONAL_FP32_FUNCS, LOSS_OUTPUT_FUNCTIONS (:func:`module_names`)."""
from ..._src.amp.lists import module_names

globals().update(module_names('float16'))
del module_names
