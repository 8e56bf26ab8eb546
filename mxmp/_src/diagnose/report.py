""":class:`NumericsReport`, what :func:`mxmp.diagnose` returns: its table, JSON and PNG charts
(drawn against one number format; docs/diagnose.md)."""
import dataclasses
import json
import math
import os
from typing import Dict, Tuple

import numpy as np

from ..files import write_atomic
from ..plotting import pyplot, save_png
from .stats import HIST_LO, LayerStats, LossScaleAdvice, _pct, merged, number_format


@dataclasses.dataclass(frozen=True, eq=False)
class NumericsReport:
    """What :func:`mxmp.diagnose` found.

    Attributes:
        target_dtype (str): the dtype the layers were chosen for.
        steps (int): float32 iterations run.
        batch_size (int): samples per iteration.
        losses (tuple of float): mean loss of each iteration.
        layers (tuple of LayerStats): in graph order.
        loss_scale (dict str -> LossScaleAdvice): per format.
        reasons (dict str -> dict str -> tuple of str): per format, flagged layer -> why.
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
        """Layer names to keep in float32 for ``dtype`` (default the target), graph order."""
        return tuple(self.reasons[number_format(dtype or self.target_dtype).name])

    @property
    def excluded_names(self):
        """tuple of str: :meth:`recommended` for the target dtype."""
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

    def table(self, dtype=None, flagged_only=False):
        """str: loss-scale advice and one row per layer, in ``dtype``'s format (default the
        target dtype); ``flagged_only``: only the layers recommended for float32."""
        fmt = number_format(dtype or self.target_dtype)
        advice = self.loss_scale[fmt.name]
        reasons = self.reasons[fmt.name]
        k = advice.log2_scale
        lines = ['mxmp numerics report for %s: overflow above %g, subnormal below 2^%d, zero below '
                 '2^%d, %d significant bits' % (fmt.name, fmt.max_finite, fmt.log2_min_normal,
                                                fmt.log2_zero_below, fmt.significand_bits)]
        losses = ', '.join('%.4g' % l for l in self.losses)
        lines.append('%d float32 iteration(s), batch %d, loss %s; %d layer(s) would compute in %s'
                     % (self.steps, self.batch_size, losses, len(self.layers),
                        self.target_dtype))
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
        names = self.recommended(fmt.name)
        if names:
            lines.append('keep in float32 (%d layer(s)): mxmp.Policy(%r, excluded_names=%r)'
                         % (len(names), fmt.name, list(names)))
        else:
            lines.append('keep in float32: none; every layer fits %s' % fmt.name)
        header = ('layer', 'op', '|act|max', 'act ovf%', 'act sub%', 'act 0%', 'w ovf%', 'w 0%',
                  '|grad|max', 'agrad 0%', 'agrad 0%@S', 'wgrad 0%@S', 'fp32')
        rows = [header]
        cell = lambda frac: _pct(frac, sign='')  # noqa: E731
        for layer in self.layers:
            if flagged_only and layer.name not in reasons:
                continue
            a, g, w, wg = layer.activation, layer.act_grad, layer.weight, layer.weight_grad
            rows.append((layer.name, layer.op, _num(a.max_abs), cell(a.overflow_fraction(fmt)),
                         cell(a.subnormal_fraction(fmt)), cell(a.zero_fraction(fmt)),
                         cell(w.overflow_fraction(fmt)) if w else '-',
                         cell(w.zero_fraction(fmt)) if w else '-',
                         _num(layer.gradients().max_abs), cell(g.zero_fraction(fmt)),
                         cell(g.zero_fraction(fmt, k)),
                         cell(wg.zero_fraction(fmt, k)) if wg else '-',
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
        lines.append('%% of finite non-zero values; sub = subnormal, 0 = flushed to zero, @S = '
                     'with loss scale 2^%d; fp32 * = recommended to stay float32:' % k)
        for name in names:
            lines.append('  %s: %s' % (name, '; '.join(reasons[name])))
        return '\n'.join(lines)

    def __str__(self):
        return self.table()

    def save_plots(self, directory, dtype=None):
        """Write ``gradient_histogram.png`` and ``layer_ranges.png`` into ``directory``
        (created with its parents) in ``dtype``'s format (default the target dtype).

        Returns:
            dict str -> str: plot name -> path.
        """
        fmt = number_format(dtype or self.target_dtype).name   # save_png creates directory
        return {name: save_png(figure(self, fmt), os.path.join(directory, name + '.png'))
                for name, figure in (('gradient_histogram', gradient_histogram_figure),
                                     ('layer_ranges', layer_ranges_figure))}

    def to_dict(self):
        """JSON-ready dict of everything in the report."""
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
        """Write :meth:`to_dict` to ``path`` atomically (its directory is created); returns
        ``path``."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_atomic(path, json.dumps(self.to_dict(), indent=1))
        return path


def _num(x):
    return '0' if x == 0 else '%.3g' % x


def _count(n):
    for unit, div in (('G', 1e9), ('M', 1e6), ('k', 1e3)):
        if n >= div:
            return '%.3g%s' % (n / div, unit)
    return str(int(n))


def _shade_format(ax, fmt, lo_edge, hi_edge, legend=True):
    """Shade the format's zones on a log2 axis: zero, subnormal, normal, overflow."""
    top = math.log2(fmt.max_finite)
    zero, normal = fmt.log2_zero_below, fmt.log2_min_normal
    label = (lambda text: text) if legend else (lambda text: None)
    ax.axvspan(lo_edge, zero, color='red', alpha=0.12,
               label=label('become zero in %s (< 2^%d)' % (fmt.name, zero)))
    if normal > zero:
        ax.axvspan(zero, normal, color='orange', alpha=0.18,
                   label=label('%s subnormal (2^%d .. 2^%d)' % (fmt.name, zero, normal)))
    else:   # bfloat16: the format's subnormals exist, MXNet flushes them
        sub = int(round(math.log2(fmt.min_subnormal)))
        if sub < normal:
            ax.axvspan(max(sub, lo_edge), normal, facecolor='none', edgecolor='red',
                       hatch='//', lw=0, label=label('%s subnormals (2^%d .. 2^%d), flushed to '
                                                     'zero by MXNet' % (fmt.name, sub, normal)))
    ax.axvspan(normal, top, color='green', alpha=0.10, label=label('%s normal range' % fmt.name))
    ax.axvspan(top, hi_edge, color='red', alpha=0.25,
               label=label('overflow in %s (> %g)' % (fmt.name, fmt.max_finite)))


def _gradient_series(report):
    act = merged(layer.act_grad for layer in report.layers)
    weight = merged(layer.weight_grad for layer in report.layers)
    return [(s, label, color) for s, label, color in
            ((act, 'activation gradients', 'tab:blue'), (weight, 'weight gradients', 'tab:purple'))
            if s is not None and s.nonzero]


def gradient_histogram_figure(report, dtype=None):
    """The histogram of the gradients' log2 magnitudes against the range of ``dtype``
    (default the report's target dtype); the scaled series is drawn only where the loss scale
    rescues values. A matplotlib Figure with one Axes."""
    fmt = number_format(dtype or report.target_dtype)
    advice = report.loss_scale[fmt.name]
    k = advice.log2_scale
    series = _gradient_series(report)
    scaled = bool(series) and advice.zero_unscaled > 0 and k != 0
    used = [HIST_LO + i for s, _, _ in series for i in np.nonzero(s.hist)[0]]
    lo_edge = fmt.log2_zero_below - 6
    hi_edge = int(math.ceil(math.log2(fmt.max_finite))) + 4
    if used:
        lo_edge = min(lo_edge, min(used) - 2)
        hi_edge = max(hi_edge, max(used) + 3 + (k if scaled else 0))
    fig, ax = pyplot().subplots(figsize=(11, 6))
    _shade_format(ax, fmt, lo_edge, hi_edge)
    total = sum(s.nonzero for s, _, _ in series) or 1
    bins = np.arange(HIST_LO, HIST_LO + len(series[0][0].hist)) if series else np.array([])
    for stats, label, color in series:
        pct = 100.0 * stats.hist / total
        nz = pct > 0
        ax.bar(bins[nz] + 0.5, pct[nz], width=1.0, color=color, alpha=0.55,
               label='%s (%s values)' % (label, _count(stats.nonzero)))
    if series:
        combined = merged(stats for stats, _, _ in series)
        if scaled:
            pct = 100.0 * combined.hist / total
            nz = pct > 0
            ax.bar(bins[nz] + 0.5 + k, pct[nz], width=1.0, fill=False, edgecolor='black',
                   lw=0.8, label='all gradients x loss scale 2^%d (shifted right by %d)' % (k, k))
            scale_line = ('flushed to zero in %s: %.3g%% unscaled, %.3g%% with loss scale 2^%d'
                          % (fmt.name, 100 * advice.zero_unscaled, 100 * advice.zero_scaled, k))
        else:
            scale_line = ('flushed to zero in %s: %.3g%% unscaled: no loss scale needed'
                          % (fmt.name, 100 * advice.zero_unscaled))
        zeros = sum(s.zeros for s, _, _ in series)
        ax.text(0.01, 0.97, 'exact zeros not shown: %s of %s values\n%s\n%d significant bits: '
                'relative rounding error up to 2^-%d = %.3g%%'
                % (_count(zeros), _count(zeros + total), scale_line, fmt.significand_bits,
                   fmt.significand_bits, 100 * fmt.unit_roundoff),
                transform=ax.transAxes, va='top', fontsize=8,
                bbox=dict(facecolor='white', alpha=0.8, edgecolor='none'))
        ax.set_yscale('log')
    else:
        ax.text(0.5, 0.5, 'no non-zero gradient', ha='center', transform=ax.transAxes)
    ax.set_xlim(lo_edge, hi_edge)
    ax.set_xlabel('log2(|gradient|)')
    ax.set_ylabel('% of non-zero gradient values')
    ax.set_title('Gradient magnitudes vs. the %s range (%d float32 iteration(s), batch %d, '
                 '%d layers)' % (fmt.name, report.steps, report.batch_size, len(report.layers)))
    ax.legend(fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.13), ncol=3,
              frameon=False)
    fig.tight_layout()
    return fig


def _span(stats):
    """(lowest, highest + 1) log2 bin of the finite non-zero values, or None."""
    if stats is None or not stats.nonzero:
        return None
    idx = np.nonzero(stats.hist)[0]
    return HIST_LO + int(idx[0]), HIST_LO + int(idx[-1]) + 1


def layer_ranges_figure(report, dtype=None):
    """The per-layer chart in ``dtype``'s format (default the target): left, the log2 span of
    activations, weights and gradients over the format's zones; right, the fractions out of
    range; flagged layers in red. A matplotlib Figure with two Axes."""
    fmt = number_format(dtype or report.target_dtype)
    advice = report.loss_scale[fmt.name]
    k = advice.log2_scale
    flagged = report.reasons[fmt.name]
    layers = report.layers
    n = max(1, len(layers))
    fig, (ax_span, ax_frac) = pyplot().subplots(1, 2, figsize=(14, 2.6 + 0.24 * n),
                                                sharey=True, gridspec_kw={'width_ratios': [3, 2]})
    y = np.arange(len(layers))

    # left: where the values lie (log2 of the smallest and largest finite non-zero magnitude)
    kinds = [('activations', 'tab:green', lambda l: l.activation),
             ('weights', 'tab:brown', lambda l: l.weight),
             ('gradients', 'tab:blue', lambda l: l.gradients())]
    spans = [[_span(get(l)) for l in layers] for _, _, get in kinds]
    known = [s for row in spans for s in row if s is not None]
    lo_edge = min([fmt.log2_zero_below - 4] + [s[0] - 2 for s in known])
    hi_edge = max([int(math.ceil(math.log2(fmt.max_finite))) + 4] + [s[1] + 2 for s in known])
    _shade_format(ax_span, fmt, lo_edge, hi_edge, legend=False)
    h = 0.8 / len(kinds)
    for j, ((label, color, _), row) in enumerate(zip(kinds, spans)):
        lefts = [s[0] if s else 0 for s in row]
        widths = [s[1] - s[0] if s else 0 for s in row]
        ax_span.barh(y - 0.4 + h * (j + 0.5), widths, left=lefts, height=h, color=color,
                     label='%s (smallest to largest |x|)' % label)
    ax_span.set_xlim(lo_edge, hi_edge)
    ax_span.set_xlabel('log2(|x|) of the finite non-zero values; shaded: %s zero / subnormal / '
                       'normal / overflow' % fmt.name)
    ax_span.set_title('%s: where each layer\'s values lie (%d significant bits)'
                      % (fmt.name, fmt.significand_bits), fontsize=10)

    # right: the fractions out of range
    series = [
        ('activations overflow (> %g)' % fmt.max_finite, 'tab:red',
         [l.activation.overflow_fraction(fmt) for l in layers]),
        ('activations flush to zero', 'tab:orange', [l.activation.zero_fraction(fmt)
                                                     for l in layers]),
        ('gradients flush to zero, unscaled', 'tab:gray',
         [l.gradients().zero_fraction(fmt) for l in layers]),
    ]
    if advice.zero_unscaled > 0:    # as the report: a loss scale only where it rescues values
        series.append(('gradients flush to zero, loss scale 2^%d' % k, 'tab:purple',
                       [l.gradients().zero_fraction(fmt, k) for l in layers]))
    h = 0.8 / len(series)
    for j, (label, color, values) in enumerate(series):
        ax_frac.barh(y - 0.4 + h * (j + 0.5), [100 * v for v in values], height=h, color=color,
                     label=label)
    if not any(v for _, _, values in series for v in values):
        ax_frac.text(0.5, 0.5, 'no value overflows or flushes to zero\nin %s in any layer'
                     % fmt.name, ha='center', va='center', transform=ax_frac.transAxes,
                     fontsize=9, color='dimgray')
    ax_frac.set_xscale('symlog', linthresh=0.01)
    ax_frac.set_xlim(0, 100)
    ax_frac.set_xlabel('% of non-zero values (symlog)')
    ax_frac.set_title('out of range (red labels: keep in float32, %d of %d)'
                      % (len(flagged), len(layers)), fontsize=10)
    ax_span.set_yticks(y)
    ax_span.set_yticklabels(['%s (%s)' % (l.name, l.op) for l in layers], fontsize=7)
    for tick, layer in zip(ax_span.get_yticklabels(), layers):
        if layer.name in flagged:
            tick.set_color('red')
            tick.set_fontweight('bold')
    ax_span.set_ylim(len(layers) - 0.5, -0.5)     # first layer at the top, no padding
    for ax in (ax_span, ax_frac):
        ax.grid(True, axis='x', alpha=0.3)
    height = fig.get_size_inches()[1]
    fig.legend(fontsize=7, loc='lower center', ncol=4, frameon=False)  # every Axes' labels
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1))
    return fig
