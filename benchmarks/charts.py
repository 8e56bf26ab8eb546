"""The benchmark's bar chart (matplotlib): throughput (images/s, sequences/s or sentences/s)
and peak RSS per phase, batch and mode."""
from benchmarks.modes import MODES, PHASES, mode_label
from benchmarks.workloads import UNIT_NAMES, shape_label


def chart_phases(rows):
    """The phases that have rows, in PHASES order: one column of panels each (none empty)."""
    return [p for p in PHASES if any(r['phase'] == p for r in rows)]


def bar_chart(report, path):
    """PNG: median throughput (min-max whiskers) and peak RSS (MiB) per phase, batch and mode.

    Throughput is in the run's unit (``report['config']['unit']``: images/s, sequences/s for
    BERT, sentences/s for the encoder-decoders); the title gives the model and what a sample is
    (:func:`benchmarks.workloads.shape_label`). One column of two panels per phase that has
    rows (no empty panels). Returns the panel titles and, last, the figure's title (list of
    str).
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows, cfg = report['rows'], report['config']
    colors = dict(zip(MODES, plt.get_cmap('tab20').colors))   # one colour per mode (<= 20)
    phases = chart_phases(rows)
    fig, axes = plt.subplots(2, len(phases), figsize=(6 * len(phases), 7.5), squeeze=False)
    batches = cfg['batch_size']
    for col, phase in enumerate(phases):
        modes = [m for m in MODES if any(r['mode'] == m and r['phase'] == phase for r in rows)]
        width = 0.8 / len(modes)
        throughput = '%s/s (median)' % UNIT_NAMES[cfg.get('unit') or 'img'][0]
        for row_i, (key, ylabel) in enumerate((('img_per_s_median', throughput),
                                               ('peak_rss_mib', 'peak RSS (MiB)'))):
            ax = axes[row_i][col]
            top = max([r[key] or 0 for r in rows if r['phase'] == phase] + [1])
            for k, mode in enumerate(modes):
                for b, batch in enumerate(batches):
                    r = next((r for r in rows if (r['phase'], r['batch_size'], r['mode'])
                              == (phase, batch, mode)), None)
                    if r is None:
                        continue
                    x = b + (k - (len(modes) - 1) / 2) * width
                    label = mode_label(mode, cfg['dtype'], r['emulated']) if b == 0 else None
                    value = r[key]
                    if value is None:
                        ax.bar(x, 0, width, color=colors[mode], label=label)
                        ax.text(x, top * 0.02, 'failed', rotation=90, ha='center', va='bottom',
                                fontsize=8, color='red')
                        continue
                    err = None
                    if key == 'img_per_s_median':
                        err = [[value - r['img_per_s_min']], [r['img_per_s_max'] - value]]
                    ax.bar(x, value, width, yerr=err, capsize=2, color=colors[mode], label=label,
                           hatch='//' if r['emulated'] else None, edgecolor='black',
                           linewidth=0.5)
            ax.set_xticks(range(len(batches)))
            ax.set_xticklabels(['batch %d' % b for b in batches])
            ax.set_ylabel(ylabel)
            ax.set_title('%s, %s' % ('training' if phase == 'train' else 'inference', ylabel))
    title = fig.suptitle('%s, %s, %s on %s (hatched: emulated, numerics only; whiskers: '
                         'min-max)' % (cfg['model'], shape_label(cfg), cfg['dtype'], cfg['ctx']),
                         fontsize=10)
    legend = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc='lower center', ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [ax.get_title() for ax in axes.flat] + [title.get_text()]
