"""Dtype names: mxmp's canonical strings (``'bfloat16'`` for MXNet's numpy structured bfloat16
dtype), MXNet's dtype objects and mshadow's enum of ``__dtype__`` attributes. Imports numpy only.
"""
import numpy as np

__all__ = ['LOW_PRECISION_DTYPES', 'MSHADOW_ENUM', 'dtype_name', 'is_low_precision',
           'normalize_dtype', 'from_mshadow_enum', 'itemsize', 'mx_dtype']

#: The target dtypes mxmp converts to (float16 for NVIDIA GPUs, bfloat16 for CPUs with
#: oneDNN), whose weights get float32 master weights.
LOW_PRECISION_DTYPES = ('float16', 'bfloat16')
#: mshadow's type enum (``include/mshadow/base.h``, MXNet 1.9.1), the value of a graph
#: variable's ``__dtype__`` attribute.
MSHADOW_ENUM = {'float32': '0', 'float64': '1', 'float16': '2', 'uint8': '3', 'int32': '4',
                'int8': '5', 'int64': '6', 'bool': '7', 'bfloat16': '12'}
_FROM_ENUM = {v: k for k, v in MSHADOW_ENUM.items()}
_ITEMSIZE = {'float16': 2, 'bfloat16': 2, 'float32': 4, 'float64': 8}


def dtype_name(dtype):
    """Canonical name (str) of a dtype name, numpy dtype or MXNet's bfloat16; None for None.

    Raises:
        TypeError: ``dtype`` is not a dtype numpy understands.
    """
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype.lower() == 'bfloat16':   # numpy has no such name
        return 'bfloat16'
    npd = np.dtype(dtype)
    if npd.names == ('bfloat16',):
        return 'bfloat16'
    return npd.name


def is_low_precision(dtype):
    """bool: whether weights of ``dtype`` need float32 master weights (float16, bfloat16)."""
    return dtype_name(dtype) in LOW_PRECISION_DTYPES


def normalize_dtype(dtype, allow_float32=False):
    """``'float16'`` or ``'bfloat16'`` (or ``'float32'`` with ``allow_float32``) for any
    spelling of it (name in any case, numpy type, MXNet's bfloat16).

    Raises:
        ValueError: any other dtype; the message names the accepted ones (for ``'float32'``
            without ``allow_float32``: that a float32 network needs no conversion, and where
            mxmp's float32 kernels are measured).
    """
    accepted = LOW_PRECISION_DTYPES + (('float32',) if allow_float32 else ())
    if isinstance(dtype, str):
        name = dtype.lower()
    else:
        try:
            name = dtype_name(dtype)
        except TypeError:
            name = None
    if name == 'float32' and name not in accepted:
        raise ValueError(
            "target dtype 'float32' is not a mixed-precision target: mxmp converts to %s. A "
            'float32 network needs no conversion: run it as it is. mxmp\'s library kernels '
            '(LayerNorm, softmax with lengths, Dropout, GELU) come with a bfloat16 conversion, '
            "mxmp.convert(net, 'bfloat16'); float32 with them alone is the benchmark's "
            'baseline (scripts/benchmark.py --modes float32_mxmp_kernels), not an API'
            % ' or '.join(repr(a) for a in accepted))
    if name not in accepted:
        raise ValueError(
            'unknown target dtype %r: mxmp converts to %s (float16 for NVIDIA GPUs, bfloat16 '
            'for CPUs with oneDNN)' % (dtype, ' or '.join(repr(a) for a in accepted)))
    return name


def from_mshadow_enum(value):
    """str or None: the dtype name of a ``__dtype__`` attribute value (``'12'`` -> bfloat16);
    None for a value mshadow does not define."""
    return _FROM_ENUM.get(str(value))


def itemsize(dtype):
    """int: bytes per element of a float dtype (bfloat16: 2); 4 for a dtype not listed."""
    return _ITEMSIZE.get(dtype_name(dtype), 4)


def mx_dtype(name):
    """The dtype MXNet's ``astype``/``amp_cast``/``nd.zeros`` take for ``name``: MXNet's
    bfloat16 object for ``'bfloat16'`` (numpy has no bfloat16), the name itself otherwise."""
    if name == 'bfloat16':
        from mxnet.contrib.amp.amp import bfloat16
        return bfloat16
    return name
