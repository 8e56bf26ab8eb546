"""contrib.amp's ``lists/symbol_bf16.py`` for bfloat16: BF16_FUNCS, BF16_FP32_FUNCS, FP32_FUNCS,
WIDEST_TYPE_CASTS, CONDITIONAL_FP32_FUNCS, LOSS_OUTPUT_FUNCTIONS (:func:`module_names`)."""
from ..._src.amp.lists import module_names

globals().update(module_names('bfloat16'))
del module_names
