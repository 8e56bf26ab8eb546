"""PNG plots (matplotlib with the Agg backend, imported only when a plot is drawn): the training
curves of a metrics file (:func:`plot_run`), and the helpers the report charts use."""
import json
import math
import os

from .files import save_atomic


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend selected (ImportError without matplotlib)."""
    import matplotlib
    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, out_png):
    """Save ``fig`` to ``out_png`` at 100 dpi, atomically (directories created), close it,
    return the path."""
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    save_atomic(out_png, lambda tmp: fig.savefig(tmp, dpi=100, format='png'))
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
    try:
        with open(path, encoding='utf-8') as f:
            lines = f.read().split('\n')
    except UnicodeDecodeError as err:
        raise ValueError('%s is not a metrics file (JSON lines as examples/train_imagenet.py '
                         'writes): not UTF-8 text (%s)' % (path, err.reason)) from None
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
    return next((key for key in keys if any(_finite(r.get(key)) for r in records)), None)


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
    except (OSError, ValueError):   # UnicodeDecodeError: not text
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
    """Draw the training curves of the metrics file ``jsonl_path`` (loss, accuracy, loss scale
    if it was not 1 throughout, learning rate; docs/cli.md) to ``out_png`` (its directories
    created) and return ``out_png``. ``title`` defaults to the run's model and dtype
    (:func:`run_title`). FileNotFoundError, ValueError: as :func:`read_metrics`."""
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

    if ax_scale is not None:   # the loss-scale staircase (log2 axis), skipped steps marked
        scale_pts = [(x, r['loss_scale']) for x, r in zip(xs, steps)
                     if _finite(r.get('loss_scale'))]
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
    return fig


def _legend_or_note(ax, has_data, note):
    if has_data:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, note, ha='center', va='center', transform=ax.transAxes, color='gray')
