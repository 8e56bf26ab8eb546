"""mxmp_softmax with lengths at the edges of its 16-float vectors (the AVX-512 row kernels of
mxmp/_src/kernels/mxmp_ops.cc: float32 forward, bfloat16 forward and backward, each row read in
vectors whose last one is masked to the row's length; AVX2 builds run the portable loops on the
same cases): rows of 1 to 200 values (m not a whole number of vectors), lengths 0, 1, 15 to 17,
31 to 33, 47 to 49, 63 to 65, 127 to 129, m - 1, m and beyond it; rows with NaN or inf within
their length, NaN beyond it only, all -inf, one finite value among -inf, and probabilities
below 2**-126 (bfloat16 subnormals: vcvtneps2bf16 flushes those, round-to-nearest-even keeps
them).

Pinned: float32 output and gradient against a numpy float64 reference over the finite rows
(bounds 1e-6 relative, those of tests/kernels/test_softmax_rows.py: measured here 6e-8 and 1.2e-7
on Zen 4), 0 beyond every length; the bfloat16 output and gradient bit for bit the float32 op's
on the same values rounded to nearest even (NaN quiet), subnormals included; NaN exactly within
the lengths of the rows with NaN or inf there.
"""
import numpy as np
import pytest

import mxnet as mx
from mxnet import autograd
from mxnet.contrib.amp.amp import bfloat16

from mxmp._src.kernels.build import load_library
from tier_run import needs_library

MS = (1, 15, 16, 17, 33, 127, 128, 129, 200)
EDGES = (0, 1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 127, 128, 129)


def _rows(m, seed):
    rng = np.random.RandomState(seed)
    lengths = [n for n in EDGES if n <= m] + [m - 1, m, m + 3]
    lengths = np.array([max(n, 0) for n in lengths] + list(rng.randint(0, m + 1, size=12)))
    x = (rng.normal(size=(len(lengths), m)) * 4).astype(np.float32)
    dy = rng.normal(size=x.shape).astype(np.float32)
    n = np.minimum(lengths, m)
    last = len(lengths) - 1   # the random rows: the specials
    specials = []
    if m >= 2:
        x[last, n[last] // 2] = np.nan if n[last] else 0   # NaN within the length
        x[last - 1, :] = -np.inf                           # a row of -inf
        x[last - 2, max(n[last - 2] - 1, 0)] = np.inf      # +inf, the last value within
        specials = [r for r in (last, last - 1, last - 2) if n[r] > 0]
        x[last - 3, n[last - 3]:] = np.nan                 # NaN beyond the length: unread
        x[last - 4, :] = -np.inf                           # one finite value among -inf
        x[last - 4, rng.randint(max(n[last - 4], 1))] = 1.0
        # probabilities below 2**-126: e^-86.9 / 2 (two values at 0)
        x[last - 5, :] = -86.9
        x[last - 5, :2] = 0.0
        lengths[last - 5] = max(lengths[last - 5], min(m, 40))
        n = np.minimum(lengths, m)
    for r in range(len(lengths)):
        dy[r, n[r]:] = np.nan   # head gradients beyond a length: unread
    return x, dy, lengths, specials


def _run(x, dy, lengths, dtype):
    cast = (lambda a: mx.nd.amp_cast(mx.nd.array(a), dtype=bfloat16)) if dtype == 'bfloat16' \
        else mx.nd.array
    data, head = cast(x), cast(dy)
    data.attach_grad()
    with autograd.record():
        y = mx.nd.mxmp_softmax(data, mx.nd.array(lengths, dtype='int32'), use_length=True)
    y.backward(head)
    return y, data.grad


def _f32(a):
    return (a if a.dtype == np.float32 else mx.nd.amp_cast(a, dtype='float32')).asnumpy()


def _bits(a):   # a bfloat16 array's bits
    return np.frombuffer(a.asnumpy().tobytes(), dtype=np.uint16).reshape(a.shape)


def _round_bf16(f):
    """float32 -> bfloat16 bits, to nearest even, NaN quiet (mxmp's and MXNet's amp_cast)."""
    b = f.view(np.uint32).astype(np.uint64)
    out = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    nan = np.isnan(f)
    out[nan] = (b[nan] >> 16) | 0x40
    return out.astype(np.uint16)


def _reference(x, dy, n):
    p, dx, scale = (np.zeros(x.shape) for _ in range(3))
    for r, k in enumerate(n):
        row = x[r, :k]
        if k == 0 or np.isnan(row).any() or (row == np.inf).any() or \
                not np.isfinite(row).any():   # the NaN rows
            continue
        e = np.exp(row - row.max())
        p[r, :k] = e / e.sum()
        dot = (dy[r, :k] * p[r, :k]).sum()
        dx[r, :k] = p[r, :k] * (dy[r, :k] - dot)
        scale[r, :k] = p[r, :k] * (np.abs(dy[r, :k]) + abs(dot))
    return p, dx, scale


@needs_library
@pytest.mark.parametrize('m', MS)
def test_rows_at_vector_edges(m):
    load_library()
    x, dy, lengths, specials = _rows(m, seed=m)
    n = np.minimum(lengths, m)
    beyond = np.arange(m)[None, :] >= n[:, None]
    y32, dx32 = _run(x, dy, lengths, 'float32')
    y32, dx32 = y32.asnumpy(), dx32.asnumpy()
    assert (y32[beyond] == 0).all() and (dx32[beyond] == 0).all()
    # NaN exactly within the rows with NaN or inf there
    assert sorted(np.flatnonzero(np.isnan(y32).any(axis=1))) == sorted(specials), m
    assert all(np.isnan(y32[r, :n[r]]).all() and np.isnan(dx32[r, :n[r]]).all()
               for r in specials), m
    p, dx, scale = _reference(x.astype(np.float64), dy.astype(np.float64), n)
    for r in range(len(n)):
        if r in specials or n[r] == 0:
            continue
        assert np.abs(y32[r] - p[r]).max() <= 1e-6 * p[r].max(), (m, r, n[r])
        assert np.abs(dx32[r] - dx[r]).max() <= 1e-6 * scale[r].max(), (m, r, n[r])
    # bfloat16: the float32 op on the same values (x and dy rounded), rounded once
    xb = _f32(mx.nd.amp_cast(mx.nd.array(x), dtype=bfloat16))
    dyb = _f32(mx.nd.amp_cast(mx.nd.array(dy), dtype=bfloat16))
    yb, dxb = _run(x, dy, lengths, 'bfloat16')
    assert yb.dtype == bfloat16 and dxb.dtype == bfloat16
    ref_y, ref_dx = _run(xb, dyb, lengths, 'float32')
    np.testing.assert_array_equal(_bits(yb), _round_bf16(ref_y.asnumpy()))
    np.testing.assert_array_equal(_bits(dxb), _round_bf16(ref_dx.asnumpy()))
    if m >= 2:   # the subnormal probabilities are there, as subnormals
        sub = _bits(yb)[len(n) - 6, 2:n[len(n) - 6]]
        assert ((sub & 0x7F80) == 0).all() and (sub != 0).all(), sub
