"""``mxnet.contrib.amp``'s API on top of mxmp: migrate by changing one import.

::

    from mxnet.contrib import amp        ->      from mxmp import amp

The names and signatures are those of ``mxnet/contrib/amp/amp.py`` in MXNet 1.9.1; what
differs and why: docs/from_contrib_amp.md.
"""
from .._src.amp.contrib_amp import (_policy, convert_hybrid_block, convert_model,  # noqa: F401
    convert_symbol, disable, init, init_trainer, scale_loss, unscale)
from .._src.errors import AmpListConflict
from . import lists
from .lists import (list_conditional_fp32_ops, list_fp32_ops, list_loss_output_functions,
                    list_lp16_fp32_ops, list_lp16_ops, list_widest_type_cast)

__all__ = ['AmpListConflict', 'lists', 'init', 'disable', 'init_trainer', 'scale_loss', 'unscale',
           'convert_symbol', 'convert_model', 'convert_hybrid_block', 'list_lp16_ops',
           'list_fp32_ops', 'list_lp16_fp32_ops', 'list_widest_type_cast',
           'list_conditional_fp32_ops', 'list_loss_output_functions']
