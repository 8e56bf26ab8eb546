"""GELU's part of the numerical contract (:mod:`.contract`): the float64 reference of MXNet's
``LeakyReLU(act_type='gelu')`` and the adversarial inputs that mxmp's ``mxmp_gelu`` is run on.

Definition (MXNet 1.9.1's ``mshadow_op::gelu`` and ``gelu_grad``): ``gelu(x) = x Phi(x)`` with
``Phi(x) = (1 + erf(x / sqrt 2)) / 2``, ``gelu'(x) = Phi(x) + x phi(x)``, ``phi(x) =
exp(-x^2 / 2) / sqrt(2 pi)``. The reference takes the limits at the infinities (``gelu(-inf) =
0``, ``gelu'(+inf) = 1``, ``gelu'(-inf) = 0``), where MXNet's float32 op computes ``inf * 0``
(NaN); NaN stays NaN.
"""
import math

import numpy as np

__all__ = ['gelu_ref', 'GELU_CASES', 'GELU_BF16_CASES']

_ERFC = np.vectorize(math.erfc, otypes=[np.float64])


def gelu_ref(x, dy):
    """``[gelu(x), dy * gelu'(x)]`` in float64 (numpy arrays of any shape, NaN and inf
    included: module docstring)."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid='ignore', over='ignore'):
        cdf = np.where(np.isnan(x), np.nan, 0.5 * _ERFC(np.nan_to_num(-x / math.sqrt(2.0))))
        cdf = np.where(x == np.inf, 1.0, np.where(x == -np.inf, 0.0, cdf))
        y = np.where(cdf == 0.0, -0.0, x * cdf)
        e = np.exp(-0.5 * x * x)
        slope = cdf + np.where(e == 0.0, 0.0, x * e / math.sqrt(2.0 * math.pi))
    return [y, np.asarray(dy, np.float64) * slope]


def _case(kind, shape=(64, 1024)):
    def make(rng):
        x = rng.normal(size=shape) * 3.0
        flat = x.reshape(-1)
        dy = rng.normal(size=shape)
        if kind == 'large |x|':
            flat[:] = np.sign(flat) * 10.0 ** rng.uniform(0.5, 4.0, flat.size)
            flat[:8] = [1e30, -1e30, 3e38, -3e38, 87.0, -87.0, 16.0, -16.0]
        elif kind == 'negative tail':   # where MXNet's 1 + erf(x / sqrt 2) cancels
            flat[:] = rng.uniform(-14.0, -3.0, flat.size)
        elif kind == 'denormals and zeros':
            flat[::4] = rng.uniform(-1.0, 1.0, flat[::4].size) * 1e-39
            flat[1::4] = np.array([1e-45, -1e-45, 0.0, -0.0])[np.arange(flat[1::4].size) % 4]
        elif kind == 'NaN and inf':
            flat[::97] = np.nan
            flat[1::89] = np.inf
            flat[2::83] = -np.inf
            dy.reshape(-1)[3::101] = np.nan
        return {'x': x, 'dy': dy}
    return make


#: name -> function(rng) giving float64 ``x`` and ``dy`` (rounded to float32 by the runner).
GELU_CASES = [(kind, _case(kind)) for kind in
              ('random', 'large |x|', 'negative tail', 'denormals and zeros', 'NaN and inf')]
#: The cases also run in bfloat16.
GELU_BF16_CASES = ('random', 'large |x|', 'negative tail', 'NaN and inf')
