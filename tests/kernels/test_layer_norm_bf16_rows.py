"""The bfloat16 LayerNorm forward (mxmp_ops.cc, ``ln_forward_row_avx512`` on AVX-512 builds,
the widened double loops elsewhere) against float64, row by row, at the edges of its vector
loops and its numerics.

Pinned: out is float64's result rounded to float32 and then to bfloat16 (nearest even), the
double kernel's rounding, value for value (NaN where NaN), and mean and rstd are float64's
rounded to float32, for rows of d = 1, 15, 17, 33, 64 + 1, 768, 1000, 1024 and 4096 values
(whole vectors, partial last vectors, one value), rows with a large mean offset (1e4 + noise
of 1 and of 100, where float32 statistics would lose the noise), rows with NaN, +inf, -inf and
+-3e38, constant rows (variance 0: out = beta), beta 0 (outputs near 0, every sign), tiny gamma
(outputs in float32's subnormal range) and values near bfloat16's largest. float64 here is
numpy's (pairwise sums): the kernel's double sums add in another order, which moves a result
only where a row's sum cancels to 2**-40 of its terms (none of these rows).
"""
import numpy as np
import pytest

import mxnet as mx
from mxnet.contrib.amp.amp import bfloat16

import mxmp  # noqa: F401  (registers the library's ops)
from tier_run import needs_library


def _bf16_values(a):
    """float32 ``a`` rounded to bfloat16 (nearest even; NaN stays NaN), as float32 values."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(a), np.float32(np.nan), out)


def _rows(d, rng):
    """(rows, d) float32 values exactly representable in bfloat16: the adversarial kinds."""
    n = 24
    x = rng.normal(size=(n, d))
    x[1] = 1e4 + rng.normal(size=d)          # a large offset: the noise is bfloat16's step
    x[2] = 1e4 + 100 * rng.normal(size=d)
    x[3] = -3e-3 + 1e-6 * rng.normal(size=d)
    x[4] = 7.25                               # constant: variance 0, out = beta
    x[5] = rng.normal(size=d) * 1e30
    x[6] = rng.normal(size=d) * 1e-30
    x[7, d // 3] = np.nan
    x[8, d - 1] = np.inf
    x[9, 0] = -np.inf
    x[10, d // 2:] = 3e38                     # float32's sum of them overflows
    x[11, ::2] = -3e38
    x[12] = rng.uniform(3.3e38, 3.38e38, d)   # near bfloat16's largest
    x[13] = rng.choice([-1.0, 1.0], d) * 2.0 ** rng.randint(-60, 60, d)   # wide exponents
    return _bf16_values(x.astype(np.float32))


def _reference(x, g, b, eps):
    x64, g64, b64 = x.astype(np.float64), g.astype(np.float64), b.astype(np.float64)
    with np.errstate(all='ignore'):
        mu = x64.mean(-1, keepdims=True)
        rs = 1.0 / np.sqrt(((x64 - mu) ** 2).mean(-1, keepdims=True) + eps)
        y = ((x64 - mu) * rs * g64 + b64).astype(np.float32)
    return _bf16_values(y), mu[:, 0].astype(np.float32), rs[:, 0].astype(np.float32)


@needs_library
@pytest.mark.parametrize('d', [1, 15, 17, 33, 65, 768, 1000, 1024, 4096])
def test_bfloat16_rows_are_float64_rounded_once(d):
    rng = np.random.RandomState(d)
    x = _rows(d, rng)
    g = rng.uniform(0.5, 2, d).astype(np.float32)
    b = rng.normal(size=d).astype(np.float32)
    cases = [(g, b, 1e-5), (g, np.zeros(d, np.float32), 1e-5),   # outputs near 0
             (g * np.float32(1e-36), b * np.float32(1e-38), 1e-5),   # subnormal outputs
             (g, b, 0.0)]
    for gamma, beta, eps in cases:
        for params in ('float32', 'bfloat16'):
            if params == 'bfloat16':
                gamma, beta = _bf16_values(gamma), _bf16_values(beta)
            nd = [mx.nd.array(gamma), mx.nd.array(beta)]
            if params == 'bfloat16':
                nd = [mx.nd.amp_cast(p, dtype=bfloat16) for p in nd]
            xb = mx.nd.amp_cast(mx.nd.array(x), dtype=bfloat16)
            out = mx.nd.mxmp_layer_norm(xb, *nd, eps=eps)
            y = mx.nd.amp_cast(out[0], dtype='float32').asnumpy()
            # the values the kernel reads (MXNet's cast may flush a subnormal to 0)
            got = [mx.nd.amp_cast(a, dtype='float32').asnumpy() for a in [xb] + nd]
            want, mu, rs = _reference(*got, eps)
            where = (d, params, eps)
            np.testing.assert_array_equal(y, want, err_msg=str(where))
            np.testing.assert_array_equal(out[1].asnumpy(), mu, err_msg=str(where))
            np.testing.assert_array_equal(out[2].asnumpy(), rs, err_msg=str(where))
