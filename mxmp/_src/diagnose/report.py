"""What :func:`mxmp._src.diagnose` returns: :class:`NumericsReport`, as a text table and as JSON.

The numbers come from :mod:`mxmp._src.diagnose.stats` (formats, histograms, verdicts); the PNG
charts of :meth:`NumericsReport.save_plots` are drawn by :mod:`mxmp._src.plotting.report_charts`,
imported only when a plot is asked for (this module imports nothing from :mod:`mxmp._src.plotting`
at load time, and the charts do not import this module).
"""
import dataclasses
import json
import os
from typing import Dict, Tuple

from .stats import LayerStats, LossScaleAdvice, _pct, merged, number_format

__all__ = ['NumericsReport']


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
        return tuple(self.reasons[number_format(dtype or self.target_dtype).name])

    @property
    def excluded_names(self):
        """tuple of str: the recommended layers for the target dtype, for
        ``mxmp.Policy(excluded_names=...)``."""
        return self.recommended()

    def policy(self, **kwargs):
        """``mxmp.Policy(target_dtype, excluded_names=self.excluded_names, **kwargs)``."""
        from ..policy.policy import Policy
        return Policy(self.target_dtype, excluded_names=self.excluded_names, **kwargs)

    def layer(self, name):
        """The :class:`LayerStats` of a node name (KeyError if it was not reported)."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError('no reported layer named %r' % name)

    def gradients(self):
        """TensorStats of every reported gradient (activation and weight) together."""
        return merged(layer.gradients() for layer in self.layers)

    def table(self, dtype=None, flagged_only=False):
        """The report as text: a header with the loss-scale advice, one row per layer.

        Args:
            dtype (str): format of the columns; default the target dtype.
            flagged_only (bool): only the layers recommended for float32.

        Returns:
            str
        """
        return _format_table(self, number_format(dtype or self.target_dtype), flagged_only)

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
        from ..plotting.report_charts import save_report_plots
        return save_report_plots(self, directory, dtype)

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


def _num(x):
    return '0' if x == 0 else '%.3g' % x


def _short_pct(frac):
    """Percent for a table cell: '0', '<0.01', '12.3', '100'."""
    return _pct(frac, sign='')


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
