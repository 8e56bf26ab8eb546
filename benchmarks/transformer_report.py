"""The report of the transformer accuracy study (:mod:`benchmarks.accuracy_transformer`): the
perplexity table, the paired relative differences with their 95% interval, the loss-scale events,
the cost per run, and the curves of every run in one PNG."""
import math
import os

import numpy as np

from benchmarks.accuracy import paired_ci, write_report

DTYPES = ('float32', 'bfloat16', 'float16')
COLOURS = {'float32': 'tab:blue', 'bfloat16': 'tab:orange', 'float16': 'tab:green'}
STYLES = {'float32': '-', 'bfloat16': '--', 'float16': ':'}


def dtype_label(records):
    """'float32', 'bfloat16 (real kernels)', 'bfloat16 (emulated)', 'float16 (emulated)'; runs
    made with ``--kernels`` (``--residual-dtype``) say so: "bfloat16 (real kernels, mxmp's
    kernels='all')"."""
    dtype = records[0]['config']['dtype']
    kernels = records[0]['config'].get('kernels')
    library = ", mxmp's kernels=%r" % kernels if kernels else ''
    if records[0]['config'].get('residual_dtype'):
        library += ', residual_dtype=%r' % records[0]['config']['residual_dtype']
    if dtype == 'float32':
        return dtype + (' (%s)' % library[2:] if library else '')
    emulated = {bool(r['emulate']) for r in records}
    how = ('emulated' if emulated == {True} else 'real kernels' if emulated == {False}
           else 'mixed: some emulated')
    return '%s (%s%s)' % (dtype, how, library)


def relative_differences(ppl, ref):
    """Per seed, ``100 * (ppl[seed] / ref[seed] - 1)`` (percent) for the seeds both have.

    Parameters
    ----------
    ppl, ref : dict {seed: perplexity}
        The low-precision runs and the float32 runs.

    Returns (seeds, diffs): the shared seeds in increasing order and their differences.
    Raises ValueError when a reference perplexity is not positive.
    """
    seeds = sorted(set(ppl) & set(ref))
    for s in seeds:
        if not ref[s] > 0:
            raise ValueError('float32 perplexity of seed %d is %r; it must be positive'
                             % (s, ref[s]))
    return seeds, [100.0 * (ppl[s] / ref[s] - 1.0) for s in seeds]


def against_reference(records, reference):
    """Per dtype of ``records``, :func:`benchmarks.accuracy.paired_ci` of the relative
    differences (percent, :func:`relative_differences`) against the float32 runs of
    ``reference`` (another study's records, e.g. MXNet's kernels), same seed, plus ``seeds``
    and ``diffs``: {dtype: dict}."""
    ref = {r['config']['seed']: r['final_val_ppl'] for r in reference
           if r['config']['dtype'] == 'float32'}
    by, out = {}, {}
    for r in records:
        by.setdefault(r['config']['dtype'], {})[r['config']['seed']] = r['final_val_ppl']
    for dtype in sorted(by, key=lambda d: DTYPES.index(d) if d in DTYPES else 99):
        seeds, diffs = relative_differences(by[dtype], ref)
        if seeds:
            out[dtype] = dict(paired_ci(diffs), seeds=seeds, diffs=diffs)
    return out


def analyse(records):
    """Statistics of the recorded runs, grouped by dtype, differences paired by seed.

    Returns a dict: ``per_dtype`` {dtype: {label, seeds, ppl (per seed), mean, std (ddof=1;
    None for one run), wall_s_mean, cpu_s_mean, train_s_mean, median_step_s_mean}} and
    ``paired`` {dtype: :func:`benchmarks.accuracy.paired_ci` of the relative differences in
    percent (:func:`relative_differences`), plus ``seeds`` and ``diffs``} for every dtype but
    float32 that shares a seed with float32.
    """
    by = {}
    for r in records:
        by.setdefault(r['config']['dtype'], []).append(r)
    per, paired = {}, {}
    for dtype in sorted(by, key=lambda d: DTYPES.index(d) if d in DTYPES else 99):
        rs = sorted(by[dtype], key=lambda r: r['config']['seed'])
        ppl = [r['final_val_ppl'] for r in rs]
        per[dtype] = {
            'label': dtype_label(rs), 'seeds': [r['config']['seed'] for r in rs], 'ppl': ppl,
            'mean': float(np.mean(ppl)),
            'std': float(np.std(ppl, ddof=1)) if len(ppl) > 1 else None,
            'wall_s_mean': float(np.mean([r['wall_s'] for r in rs])),
            'cpu_s_mean': (float(np.mean([r['cpu_s'] for r in rs]))
                           if all(r.get('cpu_s') is not None for r in rs) else None),
            'train_s_mean': float(np.mean([r['train_s'] for r in rs])),
            'median_step_s_mean': float(np.mean([r['median_step_s'] for r in rs]))}
    if 'float32' in per:
        ref = dict(zip(per['float32']['seeds'], per['float32']['ppl']))
        for dtype, row in per.items():
            if dtype == 'float32':
                continue
            seeds, diffs = relative_differences(dict(zip(row['seeds'], row['ppl'])), ref)
            if seeds:
                paired[dtype] = dict(paired_ci(diffs), seeds=seeds, diffs=diffs)
    return {'per_dtype': per, 'paired': paired}


def format_header(records, command):
    """The command, the configuration, the machines and the commits of the records."""
    c, r0 = records[0]['config'], records[0]
    machines = sorted({'%s, %d logical cores, avx512_bf16 %s' % (
        r['machine']['cpu'], r['machine']['cores'],
        'yes' if r['machine']['avx512_bf16'] else 'no') for r in records})
    commits = sorted({str(r['commit']) for r in records})
    return ('Command: `%s`\n\nModel: GPT, %d layers, %d units, %d heads, context %d, dropout %g '
            '(%d parameters, %d-character vocabulary); %d steps of batch %d (Adam, peak lr %g '
            'after %d warm-up steps, cosine, clip %g) on %d training characters; validation '
            'perplexity on %d held-out characters (Hebrews to Revelation).\n\nMachine: %s. '
            'Commits of the runs: %s.\n\n'
            % (command, c['layers'], c['units'], c['heads'], c['context'], c['dropout'],
               r0['parameters'], r0['vocab_size'], c['steps'], c['batch_size'], c['lr'],
               c['warmup_steps'], c['clip'], r0['train_chars'], r0['val_chars'],
               '; '.join(machines), ', '.join(commits)))


def _paired_row(label, p, seeds):
    """One Markdown row of a paired-difference table (:func:`benchmarks.accuracy.paired_ci`
    plus ``seeds`` and ``diffs``)."""
    cells = dict(zip(p['seeds'], p['diffs']))
    ci = ('[%+.3f, %+.3f] (t=%.2f, df=%d)' % (p['low'], p['high'], p['t'], p['n'] - 1)
          if p['half_width'] is not None else 'n/a (one seed)')
    return '| %s | %s | %+.3f | %s | %s |' % (
        label, ' | '.join('%+.3f' % cells[s] if s in cells else '' for s in seeds), p['mean'],
        '%.3f' % p['std'] if p['std'] is not None else 'n/a', ci)


def format_table(records, stats):
    """The study's tables as Markdown text."""
    per, paired = stats['per_dtype'], stats['paired']
    seeds = sorted({r['config']['seed'] for r in records})
    head = ' | '.join('seed %d' % s for s in seeds)
    lines = ['Final validation perplexity per run', '', '| dtype | %s | mean | std |' % head,
             '|---|' + '---:|' * (len(seeds) + 2)]
    for row in per.values():
        cells = dict(zip(row['seeds'], row['ppl']))
        lines.append('| %s | %s | %.4f | %s |' % (
            row['label'], ' | '.join('%.4f' % cells[s] if s in cells else '' for s in seeds),
            row['mean'], '%.4f' % row['std'] if row['std'] is not None else 'n/a'))
    lines += ['', 'Paired relative difference, ppl(dtype) / ppl(float32) - 1 (%), same seed', '',
              '| dtype | %s | mean | std | 95%% CI of the mean |' % head,
              '|---|' + '---:|' * (len(seeds) + 3)]
    lines += [_paired_row(per[dtype]['label'], p, seeds) for dtype, p in paired.items()]
    if stats.get('against_reference'):
        lines += ['', 'Against the reference study\'s float32 runs (%s), ppl(run) / '
                  'ppl(reference float32) - 1 (%%), same seed' % stats['reference'], '',
                  '| runs | %s | mean | std | 95%% CI of the mean |' % head,
                  '|---|' + '---:|' * (len(seeds) + 3)]
        lines += [_paired_row(per[dtype]['label'], p, seeds)
                  for dtype, p in stats['against_reference'].items()]
    scaled = [r for r in records if r['loss_scale_events']['first_scale'] not in (None, 1.0)]
    if scaled:
        lines += ['', 'Loss-scale events', '',
                  '| run | steps | skipped steps | skipped at | scale start -> after last step '
                  '| scale changes (step: new scale) |', '|---|---:|---:|---|---|---|']
        for r in sorted(scaled, key=lambda r: r['name']):
            ev = r['loss_scale_events']
            changes = ['%d: %g' % tuple(c) for c in ev['scale_changes']]
            lines.append('| %s | %d | %d | %s | %g -> %g | %s |' % (
                r['name'], r['config']['steps'], r['skipped_steps'],
                ', '.join(str(s) for s in ev['skipped_steps'][:8])
                + (', ...' if len(ev['skipped_steps']) > 8 else '') or 'none',
                ev['first_scale'], r['loss_scale'],
                ', '.join(changes[:8]) + (', ...' if len(changes) > 8 else '') or 'none'))
    lines += ['', 'Cost per run (means; wall and CPU seconds of the whole process: start-up, '
              'data, training, evaluations; the machine was shared)', '',
              '| dtype | runs | wall s | CPU s | training s | median s/step |',
              '|---|---:|---:|---:|---:|---:|']
    for row in per.values():
        lines.append('| %s | %d | %.0f | %s | %.0f | %.3f |' % (
            row['label'], len(row['ppl']), row['wall_s_mean'],
            '%.0f' % row['cpu_s_mean'] if row['cpu_s_mean'] is not None else 'n/a',
            row['train_s_mean'], row['median_step_s_mean']))
    return '\n'.join(lines) + '\n'


def plot_curves(records, png):
    """Three panels against step, every run (one colour and line style per dtype, one line per
    seed): training loss (mean over each evaluation interval, steps skipped on overflow left
    out), validation loss (curve windows), and validation perplexity over the second half of
    training (zoom). Writes ``png``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    by = {}
    for r in records:
        by.setdefault(r['config']['dtype'], []).append(r)
    last = max(r['config']['steps'] for r in records)
    zoom = []
    for dtype, rs in sorted(by.items(), key=lambda kv: DTYPES.index(kv[0])
                            if kv[0] in DTYPES else 99):
        label, colour, style = dtype_label(rs), COLOURS.get(dtype, 'gray'), STYLES.get(dtype, '-')
        for i, r in enumerate(sorted(rs, key=lambda r: r['config']['seed'])):
            name = '%s, %d seed(s)' % (label, len(rs)) if i == 0 else None
            pts = [p for p in r['curve'] if p['train_loss'] is not None]
            axes[0].plot([p['step'] for p in pts], [p['train_loss'] for p in pts], color=colour,
                         ls=style, lw=1.2, alpha=0.8, label=name)
            axes[1].plot([p['step'] for p in r['curve']], [p['val_loss'] for p in r['curve']],
                         color=colour, ls=style, lw=1.2, marker='o', ms=3, alpha=0.8, label=name)
            tail = [p for p in r['curve'] if p['step'] >= last // 2]
            zoom += [math.exp(p['val_loss']) for p in tail]
            axes[2].plot([p['step'] for p in tail], [math.exp(p['val_loss']) for p in tail],
                         color=colour, ls=style, lw=1.2, marker='o', ms=3, alpha=0.8,
                         label=name)
    titles = ('training loss (interval means)', 'validation loss', 'validation perplexity, '
              'second half (zoom)')
    ylabels = ('cross-entropy (nats per character)', 'cross-entropy (nats per character)',
               'perplexity')
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set_xlabel('step')
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if zoom:
        pad = 0.02 * (max(zoom) - min(zoom) or 1.0)
        axes[2].set_ylim(min(zoom) - pad, max(zoom) + pad)
    fig.suptitle('GPT on the King James Bible: every run (validation on the curve windows of '
                 'Hebrews-Revelation)')
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def report(records, out, log=print, command='python -m benchmarks.accuracy_transformer',
           reference=None, reference_name=None):
    """Print the tables, write ``OUT/table.md``, ``OUT/results.json`` and ``OUT/curves.png``;
    return the statistics (:func:`analyse`). With ``reference`` (another study's records,
    described by ``reference_name``) the statistics and tables also pair every run against
    the reference's float32 run of its seed (:func:`against_reference`)."""
    stats = analyse(records)
    if reference:
        stats.update(against_reference=against_reference(records, reference),
                     reference=reference_name)
    write_report(out, format_header(records, command) + format_table(records, stats), stats,
                 lambda png: plot_curves(records, png), log)
    return stats


def compare_dirs(run_dirs, dtype='float32'):
    """The ``dtype`` runs of two studies' ``runs`` folders paired by seed: (seeds, diffs,
    :func:`benchmarks.accuracy.paired_ci` of ``ppl(first) / ppl(second) - 1`` in percent).
    Raises ValueError when they share no seed."""
    import glob
    import json
    ppl = []
    for folder in run_dirs:
        found = {}
        for path in glob.glob(os.path.join(folder, 'gpt-%s-seed*.json' % dtype)):
            with open(path) as f:
                record = json.load(f)
            found[record['config']['seed']] = record['final_val_ppl']
        ppl.append(found)
    seeds, diffs = relative_differences(*ppl)
    if not seeds:
        raise ValueError('%s and %s share no %s seed' % (run_dirs[0], run_dirs[1], dtype))
    return seeds, diffs, paired_ci(diffs)


def main(argv=None):
    """``python -m benchmarks.transformer_report RUNS_A RUNS_B [--dtype D]``: print the paired
    relative perplexity differences of two studies' runs (e.g. float32 with mxmp's Dropout
    against float32 with MXNet's Dropout drawing other masks)."""
    import argparse
    p = argparse.ArgumentParser(prog='python -m benchmarks.transformer_report',
                                description=main.__doc__.split('\n')[0])
    p.add_argument('runs', nargs=2, help='two OUT/runs folders of the transformer study')
    p.add_argument('--dtype', default='float32')
    args = p.parse_args(argv)
    seeds, diffs, ci = compare_dirs(args.runs, args.dtype)
    print('ppl(%s) / ppl(%s) - 1, %s, same seed' % (args.runs[0], args.runs[1], args.dtype))
    print(' '.join('seed %d: %+.3f%%' % sd for sd in zip(seeds, diffs)))
    print('mean %+.3f%%, 95%% interval %s over %d seeds' % (
        ci['mean'], '[%+.3f%%, %+.3f%%]' % (ci['low'], ci['high'])
        if ci['low'] is not None else 'n/a', ci['n']))
    return seeds, diffs, ci


if __name__ == '__main__':
    main()
