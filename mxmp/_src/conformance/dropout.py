"""Dropout's part of the numerical contract (:mod:`.contract`): which elements a call of
mxmp's ``mxmp_dropout`` keeps, recomputed in numpy from the seeds it returns.

``mxmp_dropout``'s second output is the call's two 32-bit seed words ``s1, s2`` (int32 bits,
shape (2,)); it keeps element ``i`` (the index in the flattened tensor) when
``h(i) >= t``, ``t = min(p * 2**32, 2**32 - 1)`` truncated to an integer, with
``h(i) = mix32(mix32(s1 + i mod 2**32) ^ s2 ^ (i >> 32))`` in 32-bit unsigned arithmetic and
``mix32`` the integer hash of mxmp/_src/kernels/mxmp_ops.cc ("Dropout kernels"). The forward
and the backward both use it, so the contract checks each against this one definition.
"""
import math

import numpy as np

__all__ = ['dropout_keep']


def _mix32(x):
    """The library's ``mix32`` on a uint32 array (products wrap modulo 2**32)."""
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7feb352d)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846ca68b)
    return x ^ (x >> np.uint32(16))


def dropout_keep(seeds, shape, p):
    """Which elements ``mxmp_dropout`` kept (module docstring).

    Args:
        seeds: the op's second output (array-like of 2 int32: the bits of ``s1, s2``).
        shape (tuple of int): the data's shape.
        p (float): the drop probability, ``0 < p < 1``.

    Returns:
        numpy bool array of ``shape``: True where the element is kept (scaled by
        ``1 / (1 - p)``), False where it is dropped (multiplied by 0).
    """
    s1, s2 = np.asarray(seeds, np.int32).reshape(2).view(np.uint32)
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint64)
    lo = (i & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    hi = (i >> np.uint64(32)).astype(np.uint32)
    threshold = np.uint32(min(math.ldexp(p, 32), 4294967295.0))
    h = _mix32(_mix32(lo + s1) ^ s2 ^ hi)
    return (h >= threshold).reshape(shape)
