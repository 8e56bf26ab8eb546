"""The mixed-precision graph pass over an MXNet Symbol (re-exports only).

Where things are:

* :mod:`mxmp.graph.symbol_json`: load/dump a Symbol's JSON, the attributes mxmp writes
  (``MARK``, ``ROUND_MARK``, ``PINNED``), :func:`is_cast_param`/:func:`cast_param_names`,
  :func:`cast_origin` (who wrote a cast) and :func:`pin_variable_dtypes`;
* :mod:`mxmp.graph.infer`: MXNet's dtype inference on a graph JSON, by node position;
* :mod:`mxmp.graph.plan`: the dtype each node computes in, and the rule that chose it;
* :mod:`mxmp.graph.convert`: :func:`convert_symbol`, the pass (its docstring describes it);
* :mod:`mxmp.graph.explain`: :func:`explain`, :func:`format_explain`, :class:`ExplainRow`;
* :mod:`mxmp.graph.strip`: :func:`remove_casts`, :func:`count_casts`, :func:`cast_origins`,
  :func:`converted_dtype`;
* :mod:`mxmp.graph.params`: the parameter arrays that go with a converted or stripped graph.
"""
from ..dtypes import LOW_PRECISION_DTYPES as _LOW, dtype_name as _dtype_name  # noqa: F401
from .convert import convert_symbol
from .explain import ExplainRow, explain, format_explain, format_explain_table  # noqa: F401
from .infer import infer_dtypes as _infer_dtypes  # noqa: F401  (tests/test_graph.py)
from .strip import (cast_origins, converted_dtype, count_casts, remove_casts,  # noqa: F401
                    previous_conversion as _previous_conversion, strip as _strip)
from .symbol_json import (MARK, PINNED, ROUND_MARK, CAST_OPS as _CAST_OPS,  # noqa: F401
                          cast_origin, cast_param_names, is_cast_param, pin_variable_dtypes,
                          dump as _dump, load as _load)

__all__ = ['convert_symbol', 'remove_casts', 'explain', 'format_explain', 'ExplainRow',
           'count_casts', 'converted_dtype', 'cast_origins']
