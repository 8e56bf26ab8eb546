"""Numerics of a report: number formats, per-tensor log2 histograms, per-layer verdicts.

The data half of :func:`mxmp.diagnose` (which captures the tensors): :class:`NumberFormat`
(float16's and bfloat16's overflow, subnormal and flush-to-zero thresholds, IEEE 754 binary16
and bfloat16), :class:`TensorStats` (a log2-magnitude histogram of one tensor),
:class:`LayerStats`, :class:`LossScaleAdvice` and :class:`NumericsReport` (what ``diagnose``
returns, with its printed table). The method follows Micikevicius et al., "Mixed Precision
Training", ICLR 2018 (section 3.2) and NVIDIA's "Training With Mixed Precision" guide
("Choosing A Scaling Factor"); see :mod:`mxmp.diagnose` for how the tensors are captured.
"""
import dataclasses
import json
import math
import os
from typing import Dict, Optional, Tuple

import numpy as np

__all__ = ['NumberFormat', 'TensorStats', 'LayerStats', 'LossScaleAdvice', 'NumericsReport',
           'FORMATS', 'FLOAT16', 'BFLOAT16', 'HIST_LO', 'HIST_HI']

#: log2 histogram range: floor(log2|x|) of every finite non-zero float32 lies in [-149, 127].
HIST_LO, HIST_HI = -149, 127
_NBINS = HIST_HI - HIST_LO + 1


@dataclasses.dataclass(frozen=True)
class NumberFormat:
    """The range of a low-precision float format.

    Attributes:
        name (str): ``'float16'`` or ``'bfloat16'``.
        max_finite (float): largest finite value; larger magnitudes overflow to inf.
        min_normal (float): smallest normal magnitude; below it values are subnormal.
        zero_below (float): magnitudes below this become zero in MXNet (for float16 the
            smallest subnormal; for bfloat16 the smallest normal, see ``BFLOAT16``).
        significand_bits (int): bits of precision, the implicit leading bit included (11 for
            float16, 8 for bfloat16): a normal value is rounded to a relative error of at most
            ``2**-significand_bits`` (:attr:`unit_roundoff`).
        min_subnormal (float): the format's smallest subnormal magnitude.
    """
    name: str
    max_finite: float
    min_normal: float
    zero_below: float
    significand_bits: int = 24
    min_subnormal: float = 2.0 ** -149

    @property
    def unit_roundoff(self) -> float:
        """float: largest relative rounding error of a normal value, ``2**-significand_bits``
        (round to nearest: half a unit in the last place)."""
        return 2.0 ** -self.significand_bits

    @property
    def risk(self) -> str:
        """str: what limits this format in training, in one sentence (for reports and plots)."""
        if self.max_finite > 1e38:
            return ('%s has float32\'s exponent range, so gradients neither underflow nor '
                    'overflow where float32 does not: precision is the risk (%d significant '
                    'bits, relative rounding error up to 2^-%d = %.3g%%: long sums and weight '
                    'updates much smaller than the weight lose digits; mxmp keeps float32 '
                    'master weights and float32 reductions for that), not underflow'
                    % (self.name, self.significand_bits, self.significand_bits,
                       100 * self.unit_roundoff))
        return ('%s\'s range is narrow (overflow above %g, zero below 2^%d): underflow of small '
                'gradients is the risk, which loss scaling addresses; %d significant bits '
                '(relative rounding error up to 2^-%d = %.3g%%)'
                % (self.name, self.max_finite, self.log2_zero_below, self.significand_bits,
                   self.significand_bits, 100 * self.unit_roundoff))

    @property
    def log2_min_normal(self) -> int:
        """int: log2 of ``min_normal``."""
        return int(round(math.log2(self.min_normal)))

    @property
    def log2_zero_below(self) -> int:
        """int: log2 of ``zero_below``."""
        return int(round(math.log2(self.zero_below)))


#: IEEE 754 binary16: max 65504, normal from 2**-14, smallest subnormal 2**-24, 11 significant
#: bits.
FLOAT16 = NumberFormat('float16', 65504.0, 2.0 ** -14, 2.0 ** -24, 11, 2.0 ** -24)
#: bfloat16: float32's 8-bit exponent with 8 significant bits: max (2 - 2**-7) * 2**127
#: (about 3.39e38), normal from 2**-126, subnormals down to 2**-133 in the format. MXNet 1.9.1's
#: bfloat16 conversion flushes them: ``nd.amp_cast`` of 2**-127, 2**-130 and 2**-133 to bfloat16
#: and back gives 0 (measured with real kernels and with DNNL_MAX_CPU_ISA=AVX2), as Intel's
#: BF16 conversion instructions treat denormals as zero. So below 2**-126 counts as zero.
BFLOAT16 = NumberFormat('bfloat16', (2.0 - 2.0 ** -7) * 2.0 ** 127, 2.0 ** -126, 2.0 ** -126, 8,
                        2.0 ** -133)
FORMATS = {'float16': FLOAT16, 'bfloat16': BFLOAT16}


# ---------------------------------------------------------------------------------------------
# Statistics of one tensor (accumulated over steps)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class TensorStats:
    """Magnitude statistics of one tensor, accumulated over the diagnosed steps.

    Attributes:
        count (int): elements seen (all steps).
        zeros (int): exact zeros.
        nonfinite (int): inf/NaN already in float32.
        max_abs (float): largest finite magnitude (0 if none).
        hist (numpy.ndarray of int64): ``hist[i]`` counts the finite non-zero values with
            ``floor(log2|x|) == HIST_LO + i``.
        overflow (dict str -> int): per format name, finite values with ``|x| > max_finite``.
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
        nonfinite = int(a.size - np.count_nonzero(finite))
        nz = a[finite & (a > 0)]
        zeros = int(np.count_nonzero(a[finite] == 0))
        if nz.size:
            _, exp = np.frexp(nz)
            hist = np.bincount(exp.astype(np.int64) - 1 - HIST_LO, minlength=_NBINS)
            max_abs = float(nz.max())
        else:
            hist, max_abs = np.zeros(_NBINS, np.int64), 0.0
        overflow = {name: int(np.count_nonzero(nz > f.max_finite)) for name, f in FORMATS.items()}
        return cls(int(a.size), zeros, nonfinite, max_abs, hist.astype(np.int64), overflow)

    def merge(self, other):
        """The statistics of both tensors together."""
        if other is None:
            return self
        return TensorStats(self.count + other.count, self.zeros + other.zeros,
                           self.nonfinite + other.nonfinite, max(self.max_abs, other.max_abs),
                           self.hist + other.hist,
                           {k: self.overflow[k] + other.overflow[k] for k in self.overflow})

    @property
    def nonzero(self) -> int:
        """int: finite non-zero values (the denominator of every fraction)."""
        return int(self.hist.sum())

    def _below(self, log2_threshold):
        """Finite non-zero values with |x| < 2**log2_threshold (exact: bins are log2 floors)."""
        idx = int(log2_threshold) - HIST_LO
        return int(self.hist[:max(0, min(idx, _NBINS))].sum())

    def _fraction(self, n):
        return n / self.nonzero if self.nonzero else 0.0

    def overflow_fraction(self, fmt):
        """Fraction of the finite non-zero values beyond ``fmt``'s largest finite value."""
        return self._fraction(self.overflow[_fmt(fmt).name])

    def zero_fraction(self, fmt, log2_scale=0):
        """Fraction that becomes zero in ``fmt`` after multiplying by ``2**log2_scale``."""
        return self._fraction(self._below(_fmt(fmt).log2_zero_below - log2_scale))

    def subnormal_fraction(self, fmt, log2_scale=0):
        """Fraction that is subnormal (not zero) in ``fmt`` after scaling by ``2**log2_scale``."""
        f = _fmt(fmt)
        return self._fraction(self._below(f.log2_min_normal - log2_scale)
                              - self._below(f.log2_zero_below - log2_scale))

    def to_dict(self):
        """JSON-serialisable dict (the histogram as ``{log2 bin: count}`` of non-empty bins)."""
        return {'count': self.count, 'zeros': self.zeros, 'nonfinite': self.nonfinite,
                'max_abs': self.max_abs, 'overflow': dict(self.overflow),
                'log2_hist': {int(HIST_LO + i): int(c) for i, c in enumerate(self.hist) if c}}


def _fmt(fmt):
    if isinstance(fmt, NumberFormat):
        return fmt
    from .policy import normalize_dtype
    return FORMATS[normalize_dtype(fmt)]


def _merge(a, b):
    return b if a is None else a.merge(b)


# ---------------------------------------------------------------------------------------------
# Report objects
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class LayerStats:
    """The four tensors of one layer (graph node).

    Attributes:
        name (str): node name, e.g. ``'cifarresnetv10_conv0_fwd'`` (what
            ``Policy(excluded_names=...)`` takes).
        op (str): operator, e.g. ``'Convolution'``.
        params (tuple of str): the parameters counted as its weights.
        activation (TensorStats): its output(s).
        act_grad (TensorStats): d loss / d output.
        weight (TensorStats or None): its low-precision parameters, None if it has none.
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
        return self.act_grad.merge(self.weight_grad)


@dataclasses.dataclass(frozen=True)
class LossScaleAdvice:
    """The loss scale that keeps the gradients of the reported layers in range for one format.

    Attributes:
        dtype (str): format name.
        log2_scale (int): ``S = 2**log2_scale`` is the largest power of two with
            ``max_grad * S <= max finite`` (capped at the ``max_loss_scale`` of
            :func:`diagnose`); negative if the gradients overflow even unscaled.
        max_grad (float): largest gradient magnitude (activation and weight gradients).
        zero_unscaled (float): fraction of the non-zero gradient values that flush to zero
            without scaling.
        zero_scaled (float): the same with the loss scale ``S``.
        capped (bool): ``S`` was limited by ``max_loss_scale``, not by ``max_grad``.
    """
    dtype: str
    log2_scale: int
    max_grad: float
    zero_unscaled: float
    zero_scaled: float
    capped: bool

    @property
    def scale(self) -> float:
        """float: the loss scale ``2**log2_scale``."""
        return 2.0 ** self.log2_scale

    @property
    def rescued(self) -> float:
        """float: fraction of the gradient values that the scale saves from flushing to zero."""
        return max(0.0, self.zero_unscaled - self.zero_scaled)


@dataclasses.dataclass(frozen=True, eq=False)
class NumericsReport:
    """What :func:`diagnose` found. Immutable; print :meth:`table`, draw :meth:`save_plots`.

    Attributes:
        target_dtype (str): the dtype the layers were chosen for and the recommendation is for.
        steps (int): float32 iterations run.
        batch_size (int): samples per iteration.
        losses (tuple of float): mean loss of each iteration.
        layers (tuple of LayerStats): in graph order.
        loss_scale (dict str -> LossScaleAdvice): per format.
        reasons (dict str -> dict str -> tuple of str): per format, layer name -> why it should
            stay float32 (only flagged layers).
        underflow_tol (float): the flush-to-zero fraction above which a layer is flagged.
    """
    target_dtype: str
    steps: int
    batch_size: int
    losses: Tuple[float, ...]
    layers: Tuple[LayerStats, ...]
    loss_scale: Dict[str, LossScaleAdvice]
    reasons: Dict[str, Dict[str, Tuple[str, ...]]]
    underflow_tol: float

    def recommended(self, dtype=None):
        """Layer names to keep in float32 for ``dtype`` (default: the target dtype), in graph
        order."""
        return tuple(self.reasons[_fmt(dtype or self.target_dtype).name])

    @property
    def excluded_names(self):
        """tuple of str: the recommended layers for the target dtype, for
        ``mxmp.Policy(excluded_names=...)``."""
        return self.recommended()

    def policy(self, **kwargs):
        """``mxmp.Policy(target_dtype, excluded_names=self.excluded_names, **kwargs)``."""
        from .policy import Policy
        return Policy(self.target_dtype, excluded_names=self.excluded_names, **kwargs)

    def layer(self, name):
        """The :class:`LayerStats` of a node name (KeyError if it was not reported)."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError('no reported layer named %r' % name)

    def gradients(self):
        """TensorStats of every reported gradient (activation and weight) together."""
        total = None
        for layer in self.layers:
            total = _merge(total, layer.gradients())
        return total

    def table(self, dtype=None, flagged_only=False):
        """The report as text: a header with the loss-scale advice, one row per layer.

        Args:
            dtype (str): format of the columns; default the target dtype.
            flagged_only (bool): only the layers recommended for float32.

        Returns:
            str
        """
        return _format_table(self, _fmt(dtype or self.target_dtype), flagged_only)

    def __str__(self):
        return self.table()

    def save_plots(self, directory, dtype=None):
        """Write the PNG plots (matplotlib, Agg backend) into ``directory`` (created if needed).

        Files: ``gradient_histogram.png`` (gradient log2 magnitudes against the range of the
        format, as the activation-gradient histogram of Micikevicius et al. 2018; unscaled, and
        with the recommended loss scale where scaling rescues values) and ``layer_ranges.png``
        (per layer: where its values lie in the format's range, and the fractions that
        overflow or flush to zero). Both use the same format as :meth:`table`.

        Args:
            directory (str): output directory (created with its parents if needed).
            dtype (str): the format; default the target dtype.

        Returns:
            dict str -> str: plot name -> path.
        """
        from . import plot
        os.makedirs(directory, exist_ok=True)
        fmt = _fmt(dtype or self.target_dtype)
        return {
            'gradient_histogram': plot.plot_gradient_histogram(
                self, os.path.join(directory, 'gradient_histogram.png'), fmt.name),
            'layer_ranges': plot.plot_layer_ranges(
                self, os.path.join(directory, 'layer_ranges.png'), fmt.name),
        }

    def to_dict(self):
        """JSON-serialisable dict of everything in the report."""
        def tensor(t):
            return None if t is None else t.to_dict()
        return {
            'target_dtype': self.target_dtype, 'steps': self.steps,
            'batch_size': self.batch_size, 'losses': list(self.losses),
            'underflow_tol': self.underflow_tol,
            'loss_scale': {k: dict(dataclasses.asdict(v), scale=v.scale, rescued=v.rescued)
                           for k, v in self.loss_scale.items()},
            'recommended_float32': {k: list(v) for k, v in self.reasons.items()},
            'reasons': {k: {n: list(r) for n, r in v.items()} for k, v in self.reasons.items()},
            'layers': [{'name': l.name, 'op': l.op, 'params': list(l.params),
                        'activation': tensor(l.activation), 'act_grad': tensor(l.act_grad),
                        'weight': tensor(l.weight), 'weight_grad': tensor(l.weight_grad)}
                       for l in self.layers],
        }

    def save_json(self, path):
        """Write :meth:`to_dict` to ``path`` as JSON (its directory is created if needed)."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, 'w') as f:
            json.dump(self.to_dict(), f, indent=1)
        return path


# ---------------------------------------------------------------------------------------------
# Judgement
# ---------------------------------------------------------------------------------------------
def _advice(layers, fmt, max_loss_scale):
    grads = None
    for layer in layers:
        grads = _merge(grads, layer.gradients())
    if grads is None or grads.nonzero == 0:
        return LossScaleAdvice(fmt.name, 0, 0.0, 0.0, 0.0, False)
    cap = int(math.floor(math.log2(max_loss_scale)))
    k = int(math.floor(math.log2(fmt.max_finite / grads.max_abs)))
    while grads.max_abs * 2.0 ** k > fmt.max_finite:   # float rounding of the log
        k -= 1
    capped = k > cap
    k = min(k, cap)
    return LossScaleAdvice(fmt.name, k, grads.max_abs, grads.zero_fraction(fmt),
                           grads.zero_fraction(fmt, k), capped)


def _judge(layer, fmt, log2_scale, tol):
    """Reasons to keep ``layer`` in float32 in ``fmt`` (empty: fine in low precision).

    The rules: any activation or weight beyond the largest finite value (it becomes inf and
    inf/NaN spread through the network); more than ``tol`` of the activations flushing to
    zero (the layer's signal is lost); more than ``tol`` of the activation or weight gradients
    flushing to zero *with the recommended loss scale* (the updates are lost: the failure mode
    loss scaling addresses, Micikevicius et al. 2018, section 3.2). Weights that flush to zero
    are shown but do not flag a layer: the optimizer keeps float32 master weights, and a weight
    below 2**-24 changes a float16 sum of normal-sized terms by less than its resolution (the
    usual case is a bias in front of a BatchNorm, whose gradient is rounding noise).
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


def _num(x):
    return '0' if x == 0 else '%.3g' % x


def _short_pct(frac):
    """Percent for a table cell: '0', '<0.01', '12.3', '100'."""
    if frac == 0:
        return '0'
    if frac < 1e-4:
        return '<0.01'
    return '%.3g' % (100 * frac)


def _format_table(report, fmt, flagged_only):
    advice = report.loss_scale[fmt.name]
    reasons = report.reasons[fmt.name]
    k = advice.log2_scale
    lines = ['mxmp numerics report for %s: overflow above %g, subnormal below 2^%d, zero below '
             '2^%d, %d significant bits' % (fmt.name, fmt.max_finite, fmt.log2_min_normal,
                                            fmt.log2_zero_below, fmt.significand_bits)]
    losses = ', '.join('%.4g' % l for l in report.losses)
    lines.append('%d float32 iteration(s), batch %d, loss %s; %d layer(s) would compute in %s'
                 % (report.steps, report.batch_size, losses, len(report.layers),
                    report.target_dtype))
    if advice.max_grad == 0:
        lines.append('loss scale: no non-zero gradient seen')
    elif advice.zero_unscaled == 0:
        lines.append('loss scale: not needed, no gradient value flushes to zero in %s '
                     'unscaled (max |gradient| %.3g; largest safe scale 2^%d%s)'
                     % (fmt.name, advice.max_grad, k, ', capped' if advice.capped else ''))
    else:
        note = ' (capped)' if advice.capped else ''
        if k < 0:
            note += ': gradients overflow %s even unscaled' % fmt.name
        lines.append('loss scale: 2^%d = %g%s keeps max |gradient| %.3g in range (x scale = '
                     '%.4g <= %g)' % (k, advice.scale, note, advice.max_grad,
                                      advice.max_grad * advice.scale, fmt.max_finite))
        lines.append('gradient values that flush to zero: %s unscaled, %s with 2^%d; the scale '
                     'rescues %s' % (_pct(advice.zero_unscaled), _pct(advice.zero_scaled), k,
                                     _pct(advice.rescued)))
    lines.append('precision: ' + fmt.risk)
    names = report.recommended(fmt.name)
    if names:
        lines.append('keep in float32 (%d layer(s)): mxmp.Policy(%r, excluded_names=%r)'
                     % (len(names), fmt.name, list(names)))
    else:
        lines.append('keep in float32: none; every layer fits %s' % fmt.name)
    header = ('layer', 'op', '|act|max', 'act ovf%', 'act sub%', 'act 0%', 'w ovf%', 'w 0%',
              '|grad|max', 'agrad 0%', 'agrad 0%@S', 'wgrad 0%@S', 'fp32')
    rows = [header]
    for layer in report.layers:
        if flagged_only and layer.name not in reasons:
            continue
        a, g, w, wg = layer.activation, layer.act_grad, layer.weight, layer.weight_grad
        rows.append((layer.name, layer.op, _num(a.max_abs), _short_pct(a.overflow_fraction(fmt)),
                     _short_pct(a.subnormal_fraction(fmt)), _short_pct(a.zero_fraction(fmt)),
                     _short_pct(w.overflow_fraction(fmt)) if w else '-',
                     _short_pct(w.zero_fraction(fmt)) if w else '-',
                     _num(layer.gradients().max_abs), _short_pct(g.zero_fraction(fmt)),
                     _short_pct(g.zero_fraction(fmt, k)),
                     _short_pct(wg.zero_fraction(fmt, k)) if wg else '-',
                     '*' if layer.name in reasons else ''))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines.append('')
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [c.rjust(wd) for c, wd in zip(row[2:], widths[2:])]
        lines.append('  '.join(cells).rstrip())
        if n == 0:
            lines.append('  '.join('-' * wd for wd in widths))
    lines.append('')
    lines.append('%% of finite non-zero values; sub = subnormal, 0 = flushed to zero, @S = with '
                 'loss scale 2^%d; fp32 * = recommended to stay float32:' % k)
    for name in names:
        lines.append('  %s: %s' % (name, '; '.join(reasons[name])))
    return '\n'.join(lines)


def _pct(frac):
    if frac == 0:
        return '0'
    if frac < 1e-4:
        return '<0.01%'
    return '%.3g%%' % (100 * frac)
