"""The PNG charts of :func:`mxmp._src.diagnose`'s report, drawn against one number format.

* :func:`plot_gradient_histogram`: the gradients' log2 magnitudes against the format's range,
  as the activation-gradient histogram figure of Micikevicius et al., "Mixed Precision
  Training", ICLR 2018: left of the format's zero threshold values become zero, between it and
  the smallest normal they are subnormal, right of the largest finite value they overflow.
* :func:`plot_layer_ranges`: per layer, where its activations, weights and gradients lie in the
  format's range (log2 spans), and the fractions that overflow or flush to zero.

The format is float16 (IEEE 754 binary16: overflow above 65504, subnormal below 2**-14, zero
below 2**-24, 11 significant bits) or bfloat16 (float32's exponent: overflow above about
3.39e38, zero below 2**-126 in MXNet, which flushes bfloat16's subnormals, 8 significant bits):
see :mod:`mxmp._src.diagnose.stats`. The report's table (:meth:`NumericsReport.table`) uses the same
format, so the table and the plots agree. ``*_figure`` functions return the matplotlib Figure
(for tests and notebooks); ``plot_*`` save it as a PNG and return the path;
:func:`save_report_plots` writes both (what :meth:`NumericsReport.save_plots` calls).

This module imports :mod:`mxmp._src.diagnose.stats` (formats, histogram bins) and reads the report
it is given; nothing in :mod:`mxmp._src.diagnose` imports it at load time.
"""
import math
import os

import numpy as np

from ..diagnose.stats import HIST_LO, merged, number_format
from .figures import pyplot, save_png

__all__ = ['gradient_histogram_figure', 'plot_gradient_histogram', 'layer_ranges_figure',
           'plot_layer_ranges', 'save_report_plots']


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
    """The figure of :func:`plot_gradient_histogram` (a matplotlib Figure, one Axes)."""
    fmt = number_format(dtype or report.target_dtype)
    plt = pyplot()
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
    fig, ax = plt.subplots(figsize=(11, 6))
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


def plot_gradient_histogram(report, out_png, dtype=None):
    """Histogram of the gradients' log2 magnitudes against a format's range (PNG).

    x is ``log2(|gradient|)`` (exact zeros left out, their share noted), y the percentage of
    values per power of two (log scale); shaded: where the format flushes to zero, its
    subnormals, its normal range, its overflow. Series: activation and weight gradients
    unscaled, and, when the recommended loss scale rescues values from flushing to zero, all
    gradients times that scale. For bfloat16 no scaled series is drawn when nothing flushes
    (its range is float32's): the note gives its 8 significant bits instead.

    Args:
        report (mxmp.NumericsReport)
        out_png (str): output path (its directory is created).
        dtype (str): ``'float16'`` or ``'bfloat16'``; default the report's target dtype.

    Returns:
        str: ``out_png``.
    """
    return save_png(gradient_histogram_figure(report, dtype), out_png)


def _span(stats):
    """(lowest, highest + 1) log2 bin of the finite non-zero values, or None."""
    if stats is None or not stats.nonzero:
        return None
    idx = np.nonzero(stats.hist)[0]
    return HIST_LO + int(idx[0]), HIST_LO + int(idx[-1]) + 1


def layer_ranges_figure(report, dtype=None):
    """The figure of :func:`plot_layer_ranges` (a matplotlib Figure with two Axes)."""
    fmt = number_format(dtype or report.target_dtype)
    plt = pyplot()
    advice = report.loss_scale[fmt.name]
    k = advice.log2_scale
    flagged = report.reasons[fmt.name]
    layers = report.layers
    n = max(1, len(layers))
    fig, (ax_span, ax_frac) = plt.subplots(1, 2, figsize=(14, 2.6 + 0.24 * n), sharey=True,
                                           gridspec_kw={'width_ratios': [3, 2]})
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
    handles, labels = [], []
    for ax in (ax_span, ax_frac):
        hs, ls = ax.get_legend_handles_labels()
        handles += hs
        labels += ls
    fig.legend(handles, labels, fontsize=7, loc='lower center', ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1))
    return fig


def plot_layer_ranges(report, out_png, dtype=None):
    """Per-layer chart of where the values lie and what is out of range in a format (PNG).

    One row per reported layer (graph order, top to bottom; layers recommended for float32 in
    red). Left: for activations, weights and gradients, a bar from the log2 of the smallest to
    that of the largest finite non-zero magnitude, over the format's zones. Right: the
    percentage of activations that overflow or flush to zero, and of gradients that flush to
    zero unscaled and, where the report recommends a loss scale, with it (a symlog axis, so
    0.01% and 100% both show); a note says so when nothing is out of range (bfloat16's usual
    case). Arguments and return value as :func:`plot_gradient_histogram`.
    """
    return save_png(layer_ranges_figure(report, dtype), out_png)


def save_report_plots(report, directory, dtype=None):
    """Write both charts of ``report`` into ``directory`` (see :meth:`NumericsReport.save_plots`).

    Args:
        report (mxmp.NumericsReport)
        directory (str): created with its parents if needed.
        dtype (str): the format; default the report's target dtype.

    Returns:
        dict str -> str: ``{'gradient_histogram': path, 'layer_ranges': path}``.
    """
    os.makedirs(directory, exist_ok=True)
    fmt = number_format(dtype or report.target_dtype)
    return {
        'gradient_histogram': plot_gradient_histogram(
            report, os.path.join(directory, 'gradient_histogram.png'), fmt.name),
        'layer_ranges': plot_layer_ranges(
            report, os.path.join(directory, 'layer_ranges.png'), fmt.name),
    }
