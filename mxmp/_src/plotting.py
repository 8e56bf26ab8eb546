"""PNG plots (matplotlib with the Agg backend, imported only when a plot is drawn): the training
curves of a metrics file (:func:`plot_run`) and the charts of a :class:`NumericsReport`."""
import json
import math
import os

import numpy as np

from .diagnose.report import HIST_LO, merged, number_format


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend selected (ImportError without matplotlib)."""
    import matplotlib
    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, out_png):
    """Save ``fig`` to ``out_png`` at 100 dpi (directories created), close it, return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=100)
    pyplot().close(fig)
    return out_png


#: Keys accepted for accuracy, in order of preference (train_imagenet.py writes val_top1).
ACCURACY_KEYS = ('val_top1', 'val_acc', 'val_accuracy', 'accuracy', 'acc')
TRAIN_ACCURACY_KEYS = ('train_top1', 'train_acc', 'train_accuracy')


def read_metrics(path):
    """Read a metrics JSON-lines file into step records (with ``loss`` or ``skipped``) and
    epoch records (with ``epoch`` and neither), in file order; blank lines and an incomplete
    last line (a run still writing) are ignored.

    Returns:
        tuple (list of dict, list of dict): step records, epoch records.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line (other than the last) is not a JSON object, or the file holds no
            record; the message names the line.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError('no such metrics file: %s' % path)
    with open(path) as f:
        lines = f.read().split('\n')
    steps, epochs = [], []
    last = max((i for i, l in enumerate(lines) if l.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError('not a JSON object')
        except ValueError as err:
            if i == last and not line.rstrip().endswith('}'):
                break   # truncated last line of a running job
            raise ValueError('%s line %d is not a JSON object (%s): %.60s'
                             % (path, i + 1, err, line)) from None
        if 'loss' in rec or 'skipped' in rec:
            steps.append(rec)
        elif 'epoch' in rec:
            epochs.append(rec)
    if not steps and not epochs:
        raise ValueError('%s holds no metrics records (expected JSON lines with "step", "loss", '
                         '"loss_scale", "skipped", "lr" or "epoch" keys, as '
                         'examples/train_imagenet.py writes)' % path)
    return steps, epochs


def _finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _first_key(records, keys):
    for key in keys:
        if any(_finite(r.get(key)) for r in records):
            return key
    return None


#: Keys of a run's description: the header record of metrics.jsonl, or summary.json beside it.
RUN_KEYS = ('model', 'dtype', 'emulate', 'cast_params', 'loss_scale_mode')


def read_run_info(jsonl_path):
    """dict: the :data:`RUN_KEYS` known of the run (maybe none), from the first record of
    ``jsonl_path`` with a ``model`` or ``dtype`` key and no step/epoch/loss, else from
    ``summary.json`` beside it. Unreadable files are ignored."""
    def pick(record):
        return {k: record[k] for k in RUN_KEYS if k in record} \
            if isinstance(record, dict) and ('model' in record or 'dtype' in record) else {}
    try:
        with open(jsonl_path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and not {'step', 'epoch', 'loss'} & set(record):
                    info = pick(record)
                    if info:
                        return info
    except OSError:
        pass
    summary = os.path.join(os.path.dirname(os.path.abspath(jsonl_path)), 'summary.json')
    try:
        with open(summary) as f:
            return pick(json.load(f))
    except (OSError, ValueError):
        return {}


def run_title(info):
    """A figure title naming the model and dtype of :func:`read_run_info`'s dict."""
    if not info:
        return 'training run (model and dtype not recorded in the metrics file)'
    notes = [n for n, on in (('emulated', info.get('emulate')),
                             ('cast params', info.get('cast_params'))) if on]
    if info.get('loss_scale_mode') not in (None, 'none', 'auto'):   # auto: the default
        notes.append('loss scale %s' % info['loss_scale_mode'])
    return '%s, %s%s' % (info.get('model', 'model not recorded'),
                         info.get('dtype', 'dtype not recorded'),
                         ' (%s)' % ', '.join(notes) if notes else '')


def was_scaled(steps):
    """bool: whether any step ran with a loss scale other than 1 or was skipped on overflow."""
    return any(r.get('skipped') or (_finite(r.get('loss_scale')) and r['loss_scale'] != 1)
               for r in steps)


def plot_run(jsonl_path, out_png, title=None):
    """Draw the training curves of a run (loss, accuracy, loss scale if it was not 1
    throughout, learning rate) to a PNG file; the panels are listed in docs/cli.md.

    Args:
        jsonl_path (str): metrics file (see :func:`read_metrics`).
        out_png (str): output path; its directory (and parents) are created if needed.
        title (str): figure title; default the model and dtype of the run (:func:`run_title`).

    Returns:
        str: ``out_png``.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_metrics`.
    """
    return save_png(run_figure(jsonl_path, title), out_png)


def run_figure(jsonl_path, title=None):
    """The figure of :func:`plot_run` (a matplotlib Figure with 3 or 4 Axes)."""
    steps, epochs = read_metrics(jsonl_path)
    plt = pyplot()
    scaled = was_scaled(steps)
    if scaled:
        fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
        (ax_loss, ax_acc), (ax_scale, ax_lr) = axes
    else:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        (ax_loss, ax_acc, ax_lr), ax_scale = axes, None
    fig.suptitle(title or run_title(read_run_info(jsonl_path)), fontsize=11)

    # x axis: the global step (or the record index if the log has no steps)
    xs = [r.get('step', i + 1) for i, r in enumerate(steps)]
    skipped = [(x, r) for x, r in zip(xs, steps) if r.get('skipped')]

    pts = [(x, r['loss']) for x, r in zip(xs, steps) if _finite(r.get('loss'))]
    if pts:
        px, py = zip(*pts)
        ax_loss.plot(px, py, color='tab:blue', alpha=0.35, lw=0.8, label='loss per step')
        window = max(1, len(py) // 25)
        if window > 1:
            avg = [sum(py[max(0, i - window + 1):i + 1]) / len(py[max(0, i - window + 1):i + 1])
                   for i in range(len(py))]
            ax_loss.plot(px, avg, color='tab:blue', lw=1.6, label='moving average (%d)' % window)
    ep_loss = [(r.get('step'), r['train_loss']) for r in epochs
               if _finite(r.get('train_loss')) and _finite(r.get('step'))]
    if ep_loss:
        ax_loss.plot(*zip(*ep_loss), 'o-', color='tab:orange', label='epoch mean train loss')
    if skipped:
        finite_losses = [y for _, y in pts] or [0.0]
        ax_loss.plot([x for x, _ in skipped],
                     [r['loss'] if _finite(r.get('loss')) else max(finite_losses)
                      for _, r in skipped], 'x', color='red', ms=7,
                     label='skipped step (%d)' % len(skipped))
    ax_loss.set_title('training loss')
    ax_loss.set_xlabel('step')
    _legend_or_note(ax_loss, pts or ep_loss, 'no loss in the log')

    acc_key = _first_key(epochs, ACCURACY_KEYS)
    train_key = _first_key(epochs, TRAIN_ACCURACY_KEYS)
    drawn = False
    for key, style in ((acc_key, 'o-'), (train_key, 's--')):
        if key is None:
            continue
        pairs = [(r.get('epoch', i + 1), r[key]) for i, r in enumerate(epochs)
                 if _finite(r.get(key))]
        ax_acc.plot(*zip(*pairs), style, label=key)
        for x, y in pairs[-1:]:
            ax_acc.annotate('%.4f' % y, (x, y), textcoords='offset points', xytext=(4, -12),
                            fontsize=8)
        drawn = True
    ax_acc.set_title('accuracy')
    ax_acc.set_xlabel('epoch')
    from matplotlib.ticker import MaxNLocator
    ax_acc.xaxis.set_major_locator(MaxNLocator(integer=True))
    _legend_or_note(ax_acc, drawn, 'no accuracy in the log (%s)' % ', '.join(ACCURACY_KEYS[:2]))

    scale_pts = [(x, r['loss_scale']) for x, r in zip(xs, steps) if _finite(r.get('loss_scale'))]
    if ax_scale is not None:
        _scale_panel(ax_scale, scale_pts, skipped)

    lr_pts = [(x, r['lr']) for x, r in zip(xs, steps) if _finite(r.get('lr'))]
    if lr_pts:
        ax_lr.plot(*zip(*lr_pts), color='tab:purple', label='learning rate')
    ax_lr.set_title('learning rate')
    ax_lr.set_xlabel('step')
    _legend_or_note(ax_lr, lr_pts, 'no lr in the log')

    for ax in axes.ravel():
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def _scale_panel(ax_scale, scale_pts, skipped):
    """The loss-scale staircase (log2 axis) with the skipped steps marked."""
    if scale_pts:
        sx, sy = zip(*scale_pts)
        ax_scale.step(sx, sy, where='post', color='tab:green', lw=1.5, label='loss scale')
        if min(sy) > 0:
            ax_scale.set_yscale('log', base=2)
        if skipped:
            scale_at = dict(scale_pts)
            kx = [x for x, _ in skipped if x in scale_at]
            ax_scale.plot(kx, [scale_at[x] for x in kx], 'x', color='red', ms=8, mew=1.5,
                          label='skipped step (overflow): %d' % len(skipped))
    ax_scale.set_title('loss scale (after each step)')
    ax_scale.set_xlabel('step')
    _legend_or_note(ax_scale, scale_pts, 'no loss_scale in the log')


def _legend_or_note(ax, has_data, note):
    if has_data:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, note, ha='center', va='center', transform=ax.transAxes, color='gray')


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
    """Write the histogram of the gradients' log2 magnitudes against the range of ``dtype``
    (``'float16'`` or ``'bfloat16'``, default the report's target dtype) to ``out_png`` (its
    directory is created); the scaled series is drawn only where the loss scale rescues
    values. Returns ``out_png``."""
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
    """Write the per-layer chart (left: log2 span of activations, weights and gradients over
    the format's zones; right: the fractions out of range; flagged layers in red) to
    ``out_png``. Arguments and return value as :func:`plot_gradient_histogram`."""
    return save_png(layer_ranges_figure(report, dtype), out_png)


def save_report_plots(report, directory, dtype=None):
    """Both charts of ``report`` in ``directory`` (:meth:`NumericsReport.save_plots`);
    returns ``{'gradient_histogram': path, 'layer_ranges': path}``."""
    os.makedirs(directory, exist_ok=True)
    fmt = number_format(dtype or report.target_dtype)
    return {
        'gradient_histogram': plot_gradient_histogram(
            report, os.path.join(directory, 'gradient_histogram.png'), fmt.name),
        'layer_ranges': plot_layer_ranges(
            report, os.path.join(directory, 'layer_ranges.png'), fmt.name),
    }
