"""Number formats, log2 histograms and the verdicts of :func:`mxmp.diagnose` (docs/diagnose.md).

Thresholds: IEEE 754 binary16 and bfloat16; loss-scale rule and verdicts: Micikevicius et al.,
"Mixed Precision Training", ICLR 2018, section 3.2, and NVIDIA's "Training With Mixed
Precision" guide, "Choosing A Scaling Factor".
"""
import dataclasses
import math
from typing import Dict, Optional, Tuple

import numpy as np

#: log2 histogram range: floor(log2|x|) of every finite non-zero float32 lies in [-149, 127].
HIST_LO, HIST_HI = -149, 127
_NBINS = HIST_HI - HIST_LO + 1


@dataclasses.dataclass(frozen=True)
class NumberFormat:
    """The range of a low-precision float format.

    Attributes:
        name (str): ``'float16'`` or ``'bfloat16'``.
        max_finite (float): largest finite value; larger magnitudes overflow to inf.
        min_normal (float): smallest normal magnitude.
        zero_below (float): magnitudes below this become zero in MXNet.
        significand_bits (int): bits of precision, the implicit bit included.
        min_subnormal (float): the format's smallest subnormal magnitude.
    """
    name: str
    max_finite: float
    min_normal: float
    zero_below: float
    significand_bits: int
    min_subnormal: float

    @property
    def unit_roundoff(self) -> float:
        """float: ``2**-significand_bits``, the largest relative rounding error."""
        return 2.0 ** -self.significand_bits

    @property
    def risk(self) -> str:
        """str: what limits this format in training, in one sentence."""
        bits = (self.significand_bits, self.significand_bits, 100 * self.unit_roundoff)
        if self.max_finite > 1e38:
            return ('%s has float32\'s exponent range, so gradients neither underflow nor '
                    'overflow where float32 does not: precision is the risk (%d significant '
                    'bits, relative rounding error up to 2^-%d = %.3g%%: long sums and weight '
                    'updates much smaller than the weight lose digits; mxmp keeps float32 '
                    'master weights and float32 reductions for that), not underflow'
                    % ((self.name,) + bits))
        return ('%s\'s range is narrow (overflow above %g, zero below 2^%d): underflow of small '
                'gradients is the risk, which loss scaling addresses; %d significant bits '
                '(relative rounding error up to 2^-%d = %.3g%%)'
                % ((self.name, self.max_finite, self.log2_zero_below) + bits))

    @property
    def log2_min_normal(self) -> int:
        return int(round(math.log2(self.min_normal)))

    @property
    def log2_zero_below(self) -> int:
        return int(round(math.log2(self.zero_below)))


#: IEEE 754 binary16: max 65504, normal from 2**-14, smallest subnormal 2**-24, 11 bits.
FLOAT16 = NumberFormat('float16', 65504.0, 2.0 ** -14, 2.0 ** -24, 11, 2.0 ** -24)
#: bfloat16: max (2 - 2**-7) * 2**127, normal from 2**-126, 8 bits. Its subnormals (down to
#: 2**-133) count as zero: MXNet 1.9.1's bfloat16 conversion flushes them (docs/diagnose.md).
BFLOAT16 = NumberFormat('bfloat16', (2.0 - 2.0 ** -7) * 2.0 ** 127, 2.0 ** -126, 2.0 ** -126, 8,
                        2.0 ** -133)
FORMATS = {'float16': FLOAT16, 'bfloat16': BFLOAT16}


def number_format(dtype):
    """The :class:`NumberFormat` of ``dtype`` (a name, numpy dtype or NumberFormat);
    ValueError if not float16 or bfloat16."""
    if isinstance(dtype, NumberFormat):
        return dtype
    from ..dtypes import normalize_dtype
    return FORMATS[normalize_dtype(dtype)]


@dataclasses.dataclass(frozen=True, eq=False)
class TensorStats:
    """Magnitude statistics of one tensor, accumulated over the diagnosed steps.

    Attributes:
        count (int): elements seen.
        zeros (int): exact zeros.
        nonfinite (int): inf/NaN already in float32.
        max_abs (float): largest finite magnitude (0 if none).
        hist (numpy.ndarray of int64): ``hist[i]`` counts the finite non-zero values with
            ``floor(log2|x|) == HIST_LO + i``.
        overflow (dict str -> int): per format name, finite values above ``max_finite``.
    """
    count: int
    zeros: int
    nonfinite: int
    max_abs: float
    hist: np.ndarray
    overflow: Dict[str, int]

    @classmethod
    def of(cls, array):
        """Statistics of one numpy array."""
        a = np.abs(np.asarray(array, dtype=np.float32).ravel())
        finite = np.isfinite(a)
        nz = a[finite & (a > 0)]
        if nz.size:
            _, exp = np.frexp(nz)
            hist = np.bincount(exp.astype(np.int64) - 1 - HIST_LO, minlength=_NBINS)
        else:
            hist = np.zeros(_NBINS, np.int64)
        overflow = {name: int(np.count_nonzero(nz > f.max_finite)) for name, f in FORMATS.items()}
        return cls(int(a.size), int(np.count_nonzero(a[finite] == 0)),
                   int(a.size - np.count_nonzero(finite)), float(nz.max()) if nz.size else 0.0,
                   hist.astype(np.int64), overflow)

    def merge(self, other):
        """The statistics of both tensors together."""
        return TensorStats(self.count + other.count, self.zeros + other.zeros,
                           self.nonfinite + other.nonfinite, max(self.max_abs, other.max_abs),
                           self.hist + other.hist,
                           {k: self.overflow[k] + other.overflow[k] for k in self.overflow})

    @property
    def nonzero(self) -> int:
        """int: finite non-zero values (the denominator of every fraction)."""
        return int(self.hist.sum())

    def _below(self, log2_threshold):
        idx = int(log2_threshold) - HIST_LO
        return int(self.hist[:max(0, min(idx, _NBINS))].sum())

    def _fraction(self, n):
        return n / self.nonzero if self.nonzero else 0.0

    def overflow_fraction(self, fmt):
        """Fraction of the finite non-zero values above ``fmt``'s largest finite value."""
        return self._fraction(self.overflow[number_format(fmt).name])

    def zero_fraction(self, fmt, log2_scale=0):
        """Fraction that becomes zero in ``fmt`` after multiplying by ``2**log2_scale``."""
        return self._fraction(self._below(number_format(fmt).log2_zero_below - log2_scale))

    def subnormal_fraction(self, fmt, log2_scale=0):
        """Fraction that is subnormal (not zero) in ``fmt`` after scaling by ``2**log2_scale``."""
        f = number_format(fmt)
        return self._fraction(self._below(f.log2_min_normal - log2_scale)
                              - self._below(f.log2_zero_below - log2_scale))

    def to_dict(self):
        """JSON-ready dict (the histogram as ``{log2 bin: count}`` of non-empty bins)."""
        return {'count': self.count, 'zeros': self.zeros, 'nonfinite': self.nonfinite,
                'max_abs': self.max_abs, 'overflow': dict(self.overflow),
                'log2_hist': {int(HIST_LO + i): int(c) for i, c in enumerate(self.hist) if c}}


def merged(stats):
    """The :class:`TensorStats` of several tensors together (None items skipped; None if all
    are)."""
    total = None
    for item in stats:
        if item is not None:
            total = item if total is None else total.merge(item)
    return total


@dataclasses.dataclass(frozen=True, eq=False)
class LayerStats:
    """The four tensors of one layer (graph node).

    Attributes:
        name (str): node name (what ``Policy(excluded_names=...)`` takes).
        op (str): operator, e.g. ``'Convolution'``.
        params (tuple of str): the parameters counted as its weights.
        activation (TensorStats): its output(s).
        act_grad (TensorStats): d loss / d output.
        weight (TensorStats or None): its low-precision parameters.
        weight_grad (TensorStats or None): their gradients.
    """
    name: str
    op: str
    params: Tuple[str, ...]
    activation: TensorStats
    act_grad: TensorStats
    weight: Optional[TensorStats]
    weight_grad: Optional[TensorStats]

    def gradients(self):
        """TensorStats of the activation and weight gradients together."""
        return merged((self.act_grad, self.weight_grad))


@dataclasses.dataclass(frozen=True)
class LossScaleAdvice:
    """The loss scale that keeps the reported gradients in range for one format.

    Attributes:
        dtype (str): format name.
        log2_scale (int): ``S = 2**log2_scale``, the largest power of two with
            ``max_grad * S <= max finite``, capped; negative if the gradients overflow unscaled.
        max_grad (float): largest gradient magnitude.
        zero_unscaled (float): fraction of the non-zero gradients that flush to zero unscaled.
        zero_scaled (float): the same with ``S``.
        capped (bool): ``S`` was limited by ``max_loss_scale``.
    """
    dtype: str
    log2_scale: int
    max_grad: float
    zero_unscaled: float
    zero_scaled: float
    capped: bool

    @property
    def scale(self) -> float:
        return 2.0 ** self.log2_scale

    @property
    def rescued(self) -> float:
        """float: fraction of the gradient values the scale saves from flushing to zero."""
        return max(0.0, self.zero_unscaled - self.zero_scaled)


def advise_loss_scale(layers, fmt, max_loss_scale):
    """The :class:`LossScaleAdvice` for the gradients of ``layers`` (LayerStats) in ``fmt``
    (NumberFormat), the scale capped at ``max_loss_scale`` rounded down to a power of two;
    zero fields when no non-zero gradient was seen."""
    grads = merged(layer.gradients() for layer in layers)
    if grads is None or grads.nonzero == 0:
        return LossScaleAdvice(fmt.name, 0, 0.0, 0.0, 0.0, False)
    cap = int(math.floor(math.log2(max_loss_scale)))
    k = int(math.floor(math.log2(fmt.max_finite / grads.max_abs)))
    while grads.max_abs * 2.0 ** k > fmt.max_finite:   # float rounding of the log
        k -= 1
    return LossScaleAdvice(fmt.name, min(k, cap), grads.max_abs, grads.zero_fraction(fmt),
                           grads.zero_fraction(fmt, min(k, cap)), k > cap)


def judge_layer(layer, fmt, log2_scale, tol):
    """Reasons to keep ``layer`` in float32 in ``fmt`` (empty tuple: fine in low precision).

    Flagged: any activation or weight overflow; more than ``tol`` of the activations flushing
    to zero; more than ``tol`` of the activation or weight gradients flushing to zero with
    the loss scale ``2**log2_scale`` (Micikevicius et al. 2018, section 3.2). Weights that
    flush to zero do not flag a layer: the optimizer keeps float32 master weights.
    """
    why = []
    act = layer.activation
    if act.overflow_fraction(fmt) > 0:
        why.append('activations overflow (%s of values > %g, max |x| %.3g)'
                   % (_pct(act.overflow_fraction(fmt)), fmt.max_finite, act.max_abs))
    if layer.weight is not None and layer.weight.overflow_fraction(fmt) > 0:
        why.append('weights overflow (%s > %g)' % (_pct(layer.weight.overflow_fraction(fmt)),
                                                    fmt.max_finite))
    if act.zero_fraction(fmt) > tol:
        why.append('activations flush to zero (%s below %g)'
                   % (_pct(act.zero_fraction(fmt)), fmt.zero_below))
    for label, stats in (('activation gradients', layer.act_grad),
                         ('weight gradients', layer.weight_grad)):
        if stats is not None and stats.zero_fraction(fmt, log2_scale) > tol:
            why.append('%s flush to zero even with loss scale 2^%d (%s)'
                       % (label, log2_scale, _pct(stats.zero_fraction(fmt, log2_scale))))
    return tuple(why)


def _pct(frac, sign='%'):
    """A fraction as a percentage: '0', '<0.01%', '12.3%' (``sign=''`` for table cells)."""
    if frac == 0:
        return '0'
    if frac < 1e-4:
        return '<0.01' + sign
    return '%.3g' % (100 * frac) + sign
