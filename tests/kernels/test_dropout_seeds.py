"""mxmp_dropout returns its call's two seed words, not a mask, and its backward recomputes the
keep decisions from them (mxmp/_src/kernels/mxmp_ops.cc, "Dropout kernels").

Pinned, differentially against a numpy implementation of the kernel's hash written here from
the kernel's definition (independent of mxmp's own, ``mxmp._src.conformance.dropout``, which
it is also checked against): the second output is (2,) int32; out and dx are bit for bit
``x * s`` and ``dy * s`` (``s = 1/(1-p)`` float32, or float64, where the hash of the seeds keeps
the element, else 0; bfloat16: the float32 product rounded to nearest even once), NaN and inf
in data and head gradient included (a dropped NaN or inf gives NaN), on sizes across the
65,536-element blocks of hash counters and not multiples of any vector width; inference (flag 1)
is the identity and draws nothing. Before this change the second output was a uint8 mask of
data's shape (kept for the backward, with a zero head gradient of n bytes per call); the old
build's out, dx and masks were checked equal to this reference bit for bit (docs/benchmark.md,
"Dropout's seeds in place of its mask").
"""
import math

import numpy as np
import pytest

import mxnet as mx
from mxnet import autograd
from mxnet.contrib.amp.amp import bfloat16

from mxmp._src.conformance.dropout import dropout_keep
from tier_run import needs_library

# sizes: one element, a partial vector, one block less one, one block and a partial vector, and
# three blocks and a bit as a 2-D tensor (the index runs over the flattened tensor)
SHAPES = [(1,), (13,), (65535,), (65536 + 17,), (7, 28091)]


def _hash_keep(s1, s2, n, p):
    """Kept elements of a call seeded (s1, s2) (uint32), n < 2**32 elements: h(i) =
    mix(mix(s1 + i) ^ s2) >= floor(p 2**32), mix = xorshift-multiply, all mod 2**32 (in Python
    integers, vectorised as uint64 masked to 32 bits)."""
    m = np.uint64(0xFFFFFFFF)

    def mix(x):
        x = x ^ (x >> np.uint64(16))
        x = (x * np.uint64(0x7feb352d)) & m
        x = x ^ (x >> np.uint64(15))
        x = (x * np.uint64(0x846ca68b)) & m
        return x ^ (x >> np.uint64(16))

    i = np.arange(n, dtype=np.uint64)
    h = mix(mix((i + np.uint64(s1)) & m) ^ np.uint64(s2))
    return h >= np.uint64(int(min(math.ldexp(p, 32), 2.0 ** 32 - 1)))


def _bits32(a):
    """uint32 bits of an NDArray's values as float32 (bfloat16: its own bits widened, not
    MXNet's cast, which gives +0 for -0 under DNNL_MAX_CPU_ISA=AVX2)."""
    if a.dtype == bfloat16:
        return a.asnumpy().view(np.uint16).astype(np.uint32) << np.uint32(16)
    return a.asnumpy().view(np.uint32)


def _round_bf16_bits(f):
    """float32 values -> the float32 bits of their bfloat16 rounding (nearest even; a NaN stays
    a quiet NaN with its top payload bits)."""
    b = f.view(np.uint32).astype(np.uint64)
    rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    return (np.where(nan, (b >> 16) | 0x40, rounded).astype(np.uint32) << np.uint32(16))


def _values(shape, seed):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=shape) * 3
    flat = x.reshape(-1)
    flat[::97], flat[1::89], flat[2::83], flat[5::211] = np.nan, np.inf, -np.inf, 0.0
    return x


def _array(v, dtype):
    a = mx.nd.array(v, dtype='float32' if dtype == 'bfloat16' else dtype)
    return mx.nd.amp_cast(a, dtype=bfloat16) if dtype == 'bfloat16' else a


def _call(x, dy, p, flag=0.0, mode='training', seed=11):
    x.attach_grad()
    mx.random.seed(seed)
    with autograd.record():
        out, seeds = mx.nd.mxmp_dropout(x, mx.nd.array([flag]), p=p, mode=mode)
    out.backward(dy)
    return out, seeds, x.grad


def _reference(x, keep, p):
    """x * s (numpy, x's dtype: float32 or float64), s = 1/(1-p) in that dtype where kept, 0
    elsewhere, as the kernel computes it."""
    s = np.where(keep, x.dtype.type(1.0 / (1.0 - p)), x.dtype.type(0))
    with np.errstate(invalid='ignore'):
        return x * s


@needs_library
@pytest.mark.parametrize('dtype', ['float32', 'float64', 'bfloat16'])
@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('p,mode,flag', [(0.1, 'training', 0.0), (0.5, 'always', 1.0)])
def test_out_and_dx_are_the_hash_of_the_returned_seeds(dtype, shape, p, mode, flag):
    xa, dya = _array(_values(shape, 0), dtype), _array(_values(shape, 1), dtype)
    out, seeds, dx = _call(xa, dya, p, flag, mode)
    assert seeds.dtype == np.int32 and seeds.shape == (2,)
    assert out.dtype == dx.dtype == xa.dtype and out.shape == dx.shape == shape
    s1, s2 = (int(v) for v in seeds.asnumpy().view(np.uint32))
    n = int(np.prod(shape))
    keep = _hash_keep(s1, s2, n, p).reshape(shape)
    np.testing.assert_array_equal(keep, dropout_keep(seeds.asnumpy(), shape, p))
    assert abs((~keep).mean() - p) <= 5 * (p * (1 - p) / n) ** 0.5 + 1.0 / n
    for got, given in ((out, xa), (dx, dya)):   # forward and backward, one definition
        if dtype == 'float64':
            want = _reference(given.asnumpy(), keep, p).view(np.uint64)
            np.testing.assert_array_equal(got.asnumpy().view(np.uint64), want)
        else:   # the input's own values (bfloat16 widened exactly), product in float32
            f = _reference(_bits32(given).view(np.float32), keep, p)
            want = _round_bf16_bits(f) if dtype == 'bfloat16' else f.view(np.uint32)
            np.testing.assert_array_equal(_bits32(got), want)


@needs_library
def test_inference_is_the_identity_and_draws_nothing():
    shape = (65536 + 17,)
    xa, dya = _array(_values(shape, 0), 'float32'), _array(_values(shape, 1), 'float32')
    _, train_seeds, _ = _call(xa, dya, 0.1, seed=5)
    out, seeds, dx = _call(xa, dya, 0.1, flag=1.0, seed=5)
    np.testing.assert_array_equal(_bits32(out), _bits32(xa))
    np.testing.assert_array_equal(_bits32(dx), _bits32(dya))
    np.testing.assert_array_equal(seeds.asnumpy(), [0, 0])
    # nothing drawn: a training call after it gets the seeds it would get first
    mx.random.seed(5)
    with autograd.record():
        mx.nd.mxmp_dropout(xa, mx.nd.array([1.0]), p=0.1)[0].wait_to_read()
        again = mx.nd.mxmp_dropout(xa, mx.nd.zeros((1,)), p=0.1)[1]
    np.testing.assert_array_equal(again.asnumpy(), train_seeds.asnumpy())
    assert tuple(train_seeds.asnumpy()) != (0, 0)
