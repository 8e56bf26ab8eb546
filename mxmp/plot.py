"""PNG plots: training curves of a run, and the numerics report of :func:`mxmp.diagnose`.

* :func:`plot_run` reads the JSON-lines metrics file that ``examples/train_imagenet.py`` writes
  (``--save-dir/metrics.jsonl``) and draws the loss, the accuracy, the loss-scale staircase
  with the skipped steps marked, and the learning rate.
* :func:`plot_gradient_histogram` draws the gradient log2-magnitude histogram against float16's
  representable range, as the activation-gradient histogram figure of Micikevicius et al.,
  "Mixed Precision Training", ICLR 2018: the values left of 2**-24 become zero in float16,
  those between 2**-24 and 2**-14 are subnormal, those right of 65504 overflow.
* :func:`plot_layer_ranges` draws, per layer, the fraction of values that overflow or flush
  to zero in the target dtype.

matplotlib is used with its non-interactive Agg backend (no display needed); it is imported
only when a plot is drawn. Every function returns the path it wrote.
"""
import json
import math
import os

__all__ = ['read_metrics', 'plot_run', 'plot_gradient_histogram', 'plot_layer_ranges']

#: Keys accepted for accuracy, in order of preference (train_imagenet.py writes val_top1).
ACCURACY_KEYS = ('val_top1', 'val_acc', 'val_accuracy', 'accuracy', 'acc')
TRAIN_ACCURACY_KEYS = ('train_top1', 'train_acc', 'train_accuracy')


def _pyplot():
    import matplotlib
    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt
    return plt


def read_metrics(path):
    """Read a metrics JSON-lines file into step records and epoch records.

    A *step record* has a ``loss`` or ``loss_scale`` key and a ``step`` (train_imagenet.py:
    ``step, epoch, loss, loss_scale, skipped, lr``); an *epoch record* has none of ``loss`` /
    ``skipped`` but an ``epoch`` (``epoch, step, val_top1, train_loss, img_per_sec``). Blank
    lines are ignored; an incomplete last line (a run still writing) is ignored.

    Args:
        path (str): the ``.jsonl`` file.

    Returns:
        tuple (list of dict, list of dict): step records, epoch records, in file order.

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


def plot_run(jsonl_path, out_png, title=None):
    """Draw the training curves of a run to a PNG file.

    Four panels: loss per step (raw and a moving average, the per-epoch mean training loss as
    markers, skipped steps as red crosses), accuracy per epoch (validation ``val_top1`` or the
    first of ``ACCURACY_KEYS`` found, training accuracy if logged), the loss scale per step as
    a staircase on a log2 axis with the skipped (overflow) steps marked, and the learning rate.

    Args:
        jsonl_path (str): metrics file (see :func:`read_metrics`).
        out_png (str): output path; its directory is created if needed.
        title (str): figure title; default the file's path.

    Returns:
        str: ``out_png``.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_metrics`.
    """
    steps, epochs = read_metrics(jsonl_path)
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    (ax_loss, ax_acc), (ax_scale, ax_lr) = axes
    fig.suptitle(title or jsonl_path, fontsize=11)

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

    lr_pts = [(x, r['lr']) for x, r in zip(xs, steps) if _finite(r.get('lr'))]
    if lr_pts:
        ax_lr.plot(*zip(*lr_pts), color='tab:purple', label='learning rate')
    ax_lr.set_title('learning rate')
    ax_lr.set_xlabel('step')
    _legend_or_note(ax_lr, lr_pts, 'no lr in the log')

    for ax in axes.ravel():
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _save(fig, out_png)


def _legend_or_note(ax, has_data, note):
    if has_data:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, note, ha='center', va='center', transform=ax.transAxes, color='gray')


def _save(fig, out_png):
    plt = _pyplot()
    directory = os.path.dirname(os.path.abspath(out_png))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png


def plot_gradient_histogram(report, out_png):
    """Histogram of the gradients' log2 magnitudes against float16's range (PNG).

    As the activation-gradient histogram of Micikevicius et al., ICLR 2018: x is
    ``log2(|gradient|)`` (exact zeros left out, their share noted), y the percentage of values
    per power of two (log scale); shaded regions: red where float16 flushes to zero (< 2**-24)
    or overflows (> 65504), orange for float16 subnormals (2**-24 .. 2**-14), green for its
    normal range. Two series: the activation gradients and weight gradients unscaled, and all
    gradients multiplied by the recommended float16 loss scale. bfloat16's limits are drawn as
    dashed lines.

    Args:
        report (mxmp.numerics.NumericsReport)
        out_png (str)

    Returns:
        str: ``out_png``.
    """
    from .numerics import FLOAT16, BFLOAT16, HIST_LO
    import numpy as np
    plt = _pyplot()
    act, weight = None, None
    for layer in report.layers:
        act = layer.act_grad if act is None else act.merge(layer.act_grad)
        if layer.weight_grad is not None:
            weight = layer.weight_grad if weight is None else weight.merge(layer.weight_grad)
    fig, ax = plt.subplots(figsize=(11, 6))
    lo_edge, hi_edge = -60, 20
    k = report.loss_scale['float16'].log2_scale
    series = []
    for stats, label, color in ((act, 'activation gradients', 'tab:blue'),
                                (weight, 'weight gradients', 'tab:purple')):
        if stats is not None and stats.nonzero:
            series.append((stats, label, color))
    used = [HIST_LO + i for s, _, _ in series for i in np.nonzero(s.hist)[0]]
    if used:
        lo_edge = min(lo_edge, min(used) - 2, min(used) + k - 2)
        hi_edge = max(hi_edge, max(used) + 3, max(used) + k + 3)
    ax.axvspan(lo_edge, -24, color='red', alpha=0.12, label='become zero in float16 (< 2^-24)')
    ax.axvspan(-24, -14, color='orange', alpha=0.18, label='float16 subnormal (2^-24 .. 2^-14)')
    ax.axvspan(-14, math.log2(FLOAT16.max_finite), color='green', alpha=0.10,
               label='float16 normal range')
    ax.axvspan(math.log2(FLOAT16.max_finite), hi_edge, color='red', alpha=0.25,
               label='overflow in float16 (> 65504)')
    for x, text in ((math.log2(BFLOAT16.zero_below), 'bfloat16 zero below 2^-126'),
                    (math.log2(BFLOAT16.max_finite), 'bfloat16 max')):
        if lo_edge <= x <= hi_edge:
            ax.axvline(x, color='black', ls='--', lw=0.8)
            ax.text(x, 0.98, ' ' + text, rotation=90, va='top', fontsize=7,
                    transform=ax.get_xaxis_transform())
    bins = np.arange(HIST_LO, HIST_LO + len(act.hist) if act is not None else HIST_LO)
    total = sum(s.nonzero for s, _, _ in series) or 1
    for stats, label, color in series:
        pct = 100.0 * stats.hist / total
        nz = pct > 0
        ax.bar(bins[nz] + 0.5, pct[nz], width=1.0, color=color, alpha=0.55,
               label='%s (%s values)' % (label, _count(stats.nonzero)))
    if series:
        combined = series[0][0]
        for stats, _, _ in series[1:]:
            combined = combined.merge(stats)
        pct = 100.0 * combined.hist / total
        nz = pct > 0
        ax.bar(bins[nz] + 0.5 + k, pct[nz], width=1.0, fill=False, edgecolor='black', lw=0.8,
               label='all gradients x loss scale 2^%d (shifted right by %d)' % (k, k))
        zeros = sum(s.zeros for s, _, _ in series)
        adv = report.loss_scale['float16']
        ax.text(0.01, 0.97, 'exact zeros not shown: %s of %s values\nflushed to zero in float16: '
                '%.3g%% unscaled, %.3g%% with 2^%d' % (_count(zeros),
                                                       _count(zeros + total),
                                                       100 * adv.zero_unscaled,
                                                       100 * adv.zero_scaled, k),
                transform=ax.transAxes, va='top', fontsize=8,
                bbox=dict(facecolor='white', alpha=0.8, edgecolor='none'))
        ax.set_yscale('log')
    else:
        ax.text(0.5, 0.5, 'no non-zero gradient', ha='center', transform=ax.transAxes)
    ax.set_xlim(lo_edge, hi_edge)
    ax.set_xlabel('log2(|gradient|)')
    ax.set_ylabel('% of non-zero gradient values')
    ax.set_title('Gradient magnitudes vs. the float16 range (%d float32 iteration(s), batch %d, '
                 '%d layers)' % (report.steps, report.batch_size, len(report.layers)))
    ax.legend(fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.13), ncol=3,
              frameon=False)
    fig.tight_layout()
    return _save(fig, out_png)


def _count(n):
    for unit, div in (('G', 1e9), ('M', 1e6), ('k', 1e3)):
        if n >= div:
            return '%.3g%s' % (n / div, unit)
    return str(int(n))


def plot_layer_ranges(report, out_png, dtype=None):
    """Per-layer bar chart of the values that overflow or flush to zero (PNG).

    One row per reported layer (graph order, top to bottom), four bars: activations that
    overflow, activations that flush to zero, activation gradients that flush to zero
    unscaled and with the recommended loss scale (weight gradients included). Layers
    recommended for float32 have red labels. The x axis is a symlog percentage so that both
    0.01% and 100% are visible.

    Args:
        report (mxmp.numerics.NumericsReport)
        out_png (str)
        dtype (str): format; default the report's target dtype.

    Returns:
        str: ``out_png``.
    """
    from .numerics import _fmt
    import numpy as np
    plt = _pyplot()
    fmt = _fmt(dtype or report.target_dtype)
    k = report.loss_scale[fmt.name].log2_scale
    flagged = report.reasons[fmt.name]
    layers = report.layers
    n = max(1, len(layers))
    fig, ax = plt.subplots(figsize=(11, 2.4 + 0.22 * n))
    series = [
        ('activations overflow (> %g)' % fmt.max_finite, 'tab:red',
         [l.activation.overflow_fraction(fmt) for l in layers]),
        ('activations flush to zero', 'tab:orange', [l.activation.zero_fraction(fmt)
                                                     for l in layers]),
        ('gradients flush to zero, unscaled', 'tab:gray',
         [l.gradients().zero_fraction(fmt) for l in layers]),
        ('gradients flush to zero, loss scale 2^%d' % k, 'tab:blue',
         [l.gradients().zero_fraction(fmt, k) for l in layers]),
    ]
    y = np.arange(len(layers))
    h = 0.8 / len(series)
    for j, (label, color, values) in enumerate(series):
        ax.barh(y - 0.4 + h * (j + 0.5), [100 * v for v in values], height=h, color=color,
                label=label)
    ax.set_yticks(y)
    ax.set_yticklabels(['%s (%s)' % (l.name, l.op) for l in layers], fontsize=7)
    for tick, layer in zip(ax.get_yticklabels(), layers):
        if layer.name in flagged:
            tick.set_color('red')
            tick.set_fontweight('bold')
    ax.set_ylim(len(layers) - 0.5, -0.5)     # first layer at the top, no padding
    ax.set_xscale('symlog', linthresh=0.01)
    ax.set_xlim(0, 100)
    ax.set_xlabel('% of non-zero values (symlog)')
    ax.set_title('%s: values out of range per layer (red labels: keep in float32, %d of %d)'
                 % (fmt.name, len(flagged), len(layers)), fontsize=10)
    ax.grid(True, axis='x', alpha=0.3)
    height = fig.get_size_inches()[1]
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc='lower center', ncol=4,
               frameon=False)
    fig.tight_layout(rect=(0, 0.4 / height, 1, 1))
    return _save(fig, out_png)
