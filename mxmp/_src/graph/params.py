"""The parameter arrays that go with a converted (or stripped) graph.

A graph converted with ``cast_params=True`` stores some variables in the target dtype
(:func:`mxmp._src.graph.symbol_json.cast_param_names`); their arrays must be in that dtype, and every
other float array in float32, or plain MXNet cannot bind the graph. A stripped graph
(:func:`mxmp.remove_casts`) takes float32 arrays only. Casts use ``amp_cast`` (round to nearest
even; MXNet 1.9.1's ``astype`` to bfloat16 does not round the same way).
"""
import numpy as np

from ..dtypes import mx_dtype
from .symbol_json import cast_param_names

__all__ = ['float32_arrays', 'arrays_for_graph']


def _float32(array):
    import mxnet as mx
    if np.dtype(array.dtype) == np.float32:
        return array
    return mx.nd.amp_cast(array, dtype='float32')


def float32_arrays(arrays):
    """A new dict: every NDArray of ``arrays`` (dict of str -> NDArray) in float32 (arrays
    already float32 are the same objects; others, e.g. bfloat16, are cast)."""
    return {k: _float32(v) for k, v in arrays.items()}


def arrays_for_graph(sym, arrays, target_dtype):
    """A new dict: the arrays a ``cast_params=True`` graph stores in the target dtype cast to
    it, every other array in float32.

    Args:
        sym (mxnet.symbol.Symbol): the converted graph.
        arrays (dict of str -> NDArray): the parameters, named as the graph's variables (any
            float dtype).
        target_dtype (str): ``'float16'`` or ``'bfloat16'``: the graph's target dtype.
    """
    import mxnet as mx
    stored = cast_param_names(sym)
    out = float32_arrays(arrays)
    for name in stored.intersection(out):
        out[name] = mx.nd.amp_cast(out[name], dtype=mx_dtype(target_dtype))
    return out
