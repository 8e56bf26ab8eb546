"""Old path of the cast helpers: they live in :mod:`mxmp.graph.symbol_json` (graph JSON, marks,
``cast_origin``) and :mod:`mxmp.graph.strip` (remove, count, origins of casts) now."""
from .dtypes import MSHADOW_ENUM, LOW_PRECISION_DTYPES as _LOW  # noqa: F401
from .dtypes import dtype_name as _dtype_name  # noqa: F401
from .graph.strip import (cast_origins, converted_dtype, count_casts, remove_casts,  # noqa: F401
                          previous_conversion as _previous_conversion, strip as _strip)
from .graph.symbol_json import (MARK, PINNED, ROUND_MARK, CAST_OPS as _CAST_OPS,  # noqa: F401
                                FLOAT_DTYPES, cast_origin, pin_variable_dtypes,
                                dump as _dump, load as _load)

__all__ = ['MARK', 'ROUND_MARK', 'remove_casts', 'converted_dtype', 'count_casts', 'cast_origin',
           'cast_origins']

#: The old tables, derived from :data:`mxmp.dtypes.MSHADOW_ENUM` (mxmp.amp.convert_policy
#: imports ``_FLOAT_ENUM``).
_MSHADOW_ENUM = {d: MSHADOW_ENUM[d] for d in _LOW}
_FLOAT_ENUM = {d: MSHADOW_ENUM[d] for d in FLOAT_DTYPES}
