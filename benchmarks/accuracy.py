"""The accuracy study: float32 against bfloat16 (and float16) at convergence, paired by seed.

One command::

    python -m benchmarks.accuracy                      # the committed study (docs/accuracy.md)

trains ``examples/train_imagenet.py`` on the prepared Fashion-MNIST (``--rec-train``: the
60,000 training images; ``--rec-val``: the 10,000 test images) once per (dtype, seed), each run
in its own fresh Python process, with the same flags for every dtype: runs of one seed start
from the same weights and see the same batches, so their difference is the precision.
bfloat16 runs on oneDNN's bfloat16 kernels where ``mxmp.lp_kernels_available('bfloat16')`` and
emulated elsewhere; float16 is always emulated on a CPU (MXNet 1.9.1 has no float16 convolution
there) and has dynamic loss scaling. Each run's record says which.

Every run writes its own record, ``OUT/runs/<model>-<dtype>-seed<k>.json`` (final top-1, the
validation curve, losses, loss-scale events, wall time, machine, commit); a run whose record
exists with the same configuration is skipped, so the study resumes across days. A run killed
in the middle continues from its last epoch checkpoint (``--work-dir``, ``--resume`` of the
example). At the end the study prints and writes (``OUT/table.md``, ``OUT/results.json``):

* final top-1 per run, mean and standard deviation per dtype;
* the paired difference (dtype - float32) per seed, its mean and the 95% confidence interval
  of the mean (Student's t with n - 1 degrees of freedom);
* the loss-scale events (skipped steps, final scale) of runs with loss scaling;

and the validation curves of every run overlaid in ``OUT/curves.png``.
"""
import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, 'examples', 'train_imagenet.py')
DTYPES = ('float32', 'bfloat16', 'float16')
# What a run's record must agree on with the study's flags to count as done.
CONFIG_KEYS = ('model', 'dtype', 'seed', 'epochs', 'batch_size', 'lr', 'warmup_epochs', 'wd',
               'optimizer', 'rec_train', 'rec_val', 'num_train', 'num_val', 'max_train_batches')


def parse_seeds(text):
    """``'0-4'`` -> [0, 1, 2, 3, 4]; ``'0,2,5'`` -> [0, 2, 5]; ``''`` -> []."""
    seeds = []
    for part in filter(None, (p.strip() for p in text.split(','))):
        if '-' in part[1:]:
            lo, hi = part.split('-', 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    return seeds


def build_parser():
    p = argparse.ArgumentParser(
        prog='python -m benchmarks.accuracy',
        description='float32 against bfloat16/float16 at convergence on Fashion-MNIST, paired '
                    'by seed, through examples/train_imagenet.py.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--model', default='small_cnn',
                   help='model of examples/train_imagenet.py (GluonCV name or small_cnn)')
    p.add_argument('--epochs', type=int, default=6)
    p.add_argument('--batch-size', type=int, default=128)
    p.add_argument('--lr', type=float, default=0.1, help='peak learning rate (cosine to 0)')
    p.add_argument('--warmup-epochs', type=float, default=0.5)
    p.add_argument('--wd', type=float, default=1e-4)
    p.add_argument('--optimizer', default='nag')
    p.add_argument('--seeds', type=parse_seeds, default=parse_seeds('0-4'),
                   help='seeds of the float32 and bfloat16 runs, e.g. 0-4 or 0,1,2')
    p.add_argument('--float16-seeds', type=parse_seeds, default=parse_seeds('0-1'),
                   help='seeds of the emulated float16 runs (fewer: an emulated float16 run '
                        'costs about 3x the CPU time of a float32 one); "" for none')
    p.add_argument('--rec-train', default=os.path.join('data', 'fashion-mnist', 'train.rec'))
    p.add_argument('--rec-val', default=os.path.join('data', 'fashion-mnist', 'val.rec'))
    p.add_argument('--max-train-batches', type=int, default=None,
                   help='cap an epoch at N batches (tests; the study uses every image)')
    p.add_argument('--out', default=os.path.join('docs', 'accuracy'),
                   help='run records, table.md, results.json and curves.png')
    p.add_argument('--work-dir', default=os.path.join('runs', 'accuracy'),
                   help='checkpoints and logs of the runs (not committed)')
    p.add_argument('--report-only', action='store_true',
                   help='train nothing; report the runs recorded in --out')
    p.add_argument('--in-process', action='store_true',
                   help='run the trainings in this process (tests; the study uses one fresh '
                        'process per run)')
    return p


# ----------------------------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------------------------

def t_quantile(p, df):
    """Quantile ``p`` of Student's t distribution with ``df`` degrees of freedom (scipy.stats).

    Raises ValueError when ``df < 1``.
    """
    if df < 1:
        raise ValueError('Student t needs at least 1 degree of freedom, got %r' % (df,))
    from scipy import stats
    return float(stats.t.ppf(p, df))


def paired_ci(diffs, level=0.95):
    """Mean of paired differences and its two-sided confidence interval (Student's t).

    Parameters
    ----------
    diffs : sequence of float
        One difference per seed (here: dtype top-1 - float32 top-1, in points).
    level : float
        Confidence level (default 0.95).

    Returns
    -------
    dict with ``n``, ``mean``, ``std`` (sample std, ddof=1; None for n < 2), ``half_width``
    (t(1 - (1 - level) / 2, n - 1) * std / sqrt(n); None for n < 2), ``low``, ``high``
    (mean -/+ half_width; None for n < 2), ``t`` (the quantile used; None for n < 2).

    Raises ValueError for an empty sequence.
    """
    d = np.asarray(list(diffs), dtype=np.float64)
    if d.size == 0:
        raise ValueError('no paired differences')
    out = {'n': int(d.size), 'mean': float(d.mean()), 'std': None, 'half_width': None,
           'low': None, 'high': None, 't': None}
    if d.size >= 2:
        std = float(d.std(ddof=1))
        t = t_quantile(1 - (1 - level) / 2, d.size - 1)
        half = t * std / math.sqrt(d.size)
        out.update(std=std, t=t, half_width=half, low=out['mean'] - half,
                   high=out['mean'] + half)
    return out


# ----------------------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------------------

def run_name(model, dtype, seed):
    return '%s-%s-seed%d' % (model, dtype, seed)


def count_lines(path):
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def run_config(args, dtype, seed):
    """The configuration that identifies a run (stored in its record; a record with another
    configuration is not counted as done)."""
    rec_val = args.rec_val
    return {'model': args.model, 'dtype': dtype, 'seed': seed, 'epochs': args.epochs,
            'batch_size': args.batch_size, 'lr': args.lr, 'warmup_epochs': args.warmup_epochs,
            'wd': args.wd, 'optimizer': args.optimizer,
            'rec_train': os.path.basename(args.rec_train), 'rec_val': os.path.basename(rec_val),
            'num_train': count_lines(os.path.splitext(args.rec_train)[0] + '.idx'),
            'num_val': count_lines(os.path.splitext(rec_val)[0] + '.idx'),
            'max_train_batches': args.max_train_batches}


def config_digest(config):
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def load_record(path, config):
    """The record at ``path`` when it exists and was made with ``config``; else None."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except ValueError:
        return None
    if {k: record.get('config', {}).get(k) for k in CONFIG_KEYS} != config:
        return None
    return record


def train_argv(args, dtype, seed, save_dir, resume):
    argv = ['--model', args.model, '--dtype', dtype, '--seed', str(seed),
            '--epochs', str(args.epochs), '--batch-size', str(args.batch_size),
            '--lr', repr(args.lr), '--warmup-epochs', repr(args.warmup_epochs),
            '--wd', repr(args.wd), '--optimizer', args.optimizer,
            '--rec-train', args.rec_train, '--rec-val', args.rec_val,
            '--save-dir', save_dir, '--no-progress', '--log-interval', '0']
    if args.max_train_batches:
        argv += ['--max-train-batches', str(args.max_train_batches)]
    if resume:
        argv.append('--resume')
    return argv


def git_commit():
    """HEAD of the repository, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(['git', '-C', REPO, 'rev-parse', '--short', 'HEAD'],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(['git', '-C', REPO, 'status', '--porcelain', '-uno'],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ('+dirty' if dirty else '')
    except (OSError, subprocess.CalledProcessError):
        return None


def machine():
    """CPU model (the first ``model name`` of /proc/cpuinfo, else ``platform.processor()``),
    logical cores, whether the CPU flags include avx512_bf16."""
    model, flags = None, ''
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name') and model is None:
                    model = line.split(':', 1)[1].strip()
                elif line.startswith('flags') and not flags:
                    flags = line
    except OSError:
        pass
    return {'cpu': model or platform.processor(), 'cores': os.cpu_count(),
            'avx512_bf16': 'avx512_bf16' in flags.split()}


def loss_scale_events(metrics_path):
    """Skipped steps and loss-scale changes of a run, from its metrics.jsonl.

    Returns a dict: ``skipped_steps`` (list of step numbers), ``scale_changes`` (list of
    [first step that used the new scale, new scale]), ``first_scale`` and ``final_scale`` (None
    without step records), ``nonfinite_grads`` ([step, {parameter: non-finite entries} or None]
    of each skipped step, where the run logged them).
    """
    from mxmp._src.plotting import read_metrics
    skipped, changes, first, last, overflows = [], [], None, None, []
    for r in read_metrics(metrics_path)[0]:
        if 'loss_scale' not in r or 'skipped' not in r:
            continue
        if first is None:
            first = r['loss_scale']
        elif r['loss_scale'] != last:
            changes.append([r['step'], r['loss_scale']])
        last = r['loss_scale']
        if r['skipped']:
            skipped.append(r['step'])
            overflows.append([r['step'], r.get('nonfinite_grads')])
    return {'skipped_steps': skipped, 'scale_changes': changes, 'first_scale': first,
            'final_scale': last, 'nonfinite_grads': overflows}


def make_record(config, summary, metrics_path, wall_s, commit, cpu_s=None, resumed=False):
    """A run's record: what the report needs, small enough to commit.

    ``wall_s`` and ``cpu_s`` (user + system seconds of the training process; None in-process)
    are those of the last invocation only when ``resumed``; ``train_time_s`` (the sum of the
    epochs' training seconds, kept in the checkpoint) covers the whole run either way."""
    epochs = summary['epochs']
    events = loss_scale_events(metrics_path)
    final_scale = summary.get('loss_scale')
    if final_scale is not None and events['final_scale'] is not None:
        # the scale after the last step's adjustment (the summary's) beats the one it used
        events['final_scale'] = final_scale
    return {
        'config': config, 'name': run_name(config['model'], config['dtype'], config['seed']),
        'emulate': bool(summary['emulate']), 'loss_scale_mode': summary['loss_scale_mode'],
        'final_val_top1': summary['final_val_top1'],
        'val_top1': [e['val_top1'] for e in epochs],
        'train_loss': [e['train_loss'] for e in epochs],
        'img_per_sec': summary['img_per_sec'], 'train_time_s': sum(e['train_time_s']
                                                                  for e in epochs),
        'wall_s': wall_s, 'cpu_s': cpu_s, 'resumed': bool(resumed),
        'steps': summary['steps'], 'peak_rss_mib': summary['peak_rss_mib'],
        'loss_scale': events, 'skipped_steps': summary['skipped_steps'],
        'machine': machine(), 'commit': commit,
        'finished': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
    }


def run_one(args, dtype, seed, log=print):
    """Train one (dtype, seed) unless its record exists; return the record.

    The training runs ``examples/train_imagenet.py`` in a fresh process (or in this one with
    ``args.in_process``), saving into ``WORK_DIR/<name>``; a checkpoint left there by an
    interrupted run of the same configuration is resumed. Raises RuntimeError when the training
    fails (its log names the cause).
    """
    config = run_config(args, dtype, seed)
    name = run_name(args.model, dtype, seed)
    path = os.path.join(args.out, 'runs', name + '.json')
    record = load_record(path, config)
    if record is not None:
        log('%-34s done (%s), skipped' % (name, path))
        return record
    save_dir = os.path.join(args.work_dir, name)
    os.makedirs(save_dir, exist_ok=True)
    stamp = os.path.join(save_dir, 'config.json')
    resume = False
    if os.path.isfile(os.path.join(save_dir, 'checkpoint.json')) and os.path.isfile(stamp):
        with open(stamp) as f:
            resume = json.load(f).get('digest') == config_digest(config)
    with open(stamp, 'w') as f:
        json.dump({'digest': config_digest(config), 'config': config}, f)
    argv = train_argv(args, dtype, seed, save_dir, resume)
    log('%-34s training%s: train_imagenet.py %s' % (name, ' (resumed)' if resume else '',
                                                     ' '.join(argv)))
    commit = git_commit()   # the code this run starts with
    tic = time.time()
    cpu = None
    if args.in_process:
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import importlib.util
        spec = importlib.util.spec_from_file_location('_accuracy_train', SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        summary = module.main(argv)
    else:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(os.path.join(save_dir, 'stdout.log'), 'ab') as out:
            proc = subprocess.run([sys.executable, SCRIPT] + argv, stdout=out,
                                  stderr=subprocess.STDOUT, cwd=os.getcwd())
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise RuntimeError('%s failed with exit status %d; see %s' % (
                name, proc.returncode, os.path.join(save_dir, 'train.log')))
        with open(os.path.join(save_dir, 'summary.json')) as f:
            summary = json.load(f)
    wall = time.time() - tic
    record = make_record(config, summary, os.path.join(save_dir, 'metrics.jsonl'), wall,
                         commit, cpu_s=cpu, resumed=resume)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
    log('%-34s top-1 %.2f%%, %.0f s (%.0f img/s training)' % (
        name, 100 * record['final_val_top1'], wall, record['img_per_sec']))
    return record


def planned_runs(args):
    """(dtype, seed) in the order they run: float32 and bfloat16 of a seed together, seed after
    seed (an interrupted study has complete pairs), then float16."""
    plan = []
    for seed in args.seeds:
        plan += [('float32', seed), ('bfloat16', seed)]
    plan += [('float16', seed) for seed in args.float16_seeds]
    return plan


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

def dtype_label(records):
    """'bfloat16 (real kernels)', 'bfloat16 (emulated)', 'float32', 'float16 (emulated)'."""
    r = records[0]
    dtype = r['config']['dtype']
    if dtype == 'float32':
        return dtype
    emulated = {bool(x['emulate']) for x in records}
    how = ('emulated' if emulated == {True} else 'real kernels' if emulated == {False}
           else 'mixed: some emulated')
    return '%s (%s)' % (dtype, how)


def _mean_or_none(values):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def analyse(records):
    """Statistics of the recorded runs (grouped by dtype; differences paired by seed).

    Parameters
    ----------
    records : list of dict
        Run records (:func:`make_record`).

    Returns
    -------
    dict: ``per_dtype`` {dtype: {label, seeds, top1 (points, per seed), mean, std (ddof=1;
    None for one run), wall_s_mean and cpu_s_mean (runs not resumed; None without any),
    train_s_mean, img_per_sec_mean}} and ``paired`` {dtype: :func:`paired_ci`
    of dtype - float32 in points, plus ``seeds`` and ``diffs``} for every dtype other than
    float32 that shares at least one seed with float32.
    """
    by = {}
    for r in records:
        by.setdefault(r['config']['dtype'], []).append(r)
    per, paired = {}, {}
    for dtype in sorted(by, key=lambda d: DTYPES.index(d) if d in DTYPES else 99):
        rs = sorted(by[dtype], key=lambda r: r['config']['seed'])
        top1 = [100 * r['final_val_top1'] for r in rs]
        per[dtype] = {'label': dtype_label(rs), 'seeds': [r['config']['seed'] for r in rs],
                      'top1': top1, 'mean': float(np.mean(top1)),
                      'std': float(np.std(top1, ddof=1)) if len(top1) > 1 else None,
                      'wall_s_mean': _mean_or_none([r['wall_s'] for r in rs
                                                    if not r.get('resumed')]),
                      'train_s_mean': float(np.mean([r['train_time_s'] for r in rs])),
                      'cpu_s_mean': _mean_or_none([r.get('cpu_s') for r in rs
                                                   if not r.get('resumed')]),
                      'img_per_sec_mean': float(np.mean([r['img_per_sec'] for r in rs]))}
    if 'float32' in per:
        ref = dict(zip(per['float32']['seeds'], per['float32']['top1']))
        for dtype, row in per.items():
            if dtype == 'float32':
                continue
            seeds = [s for s in row['seeds'] if s in ref]
            if not seeds:
                continue
            mine = dict(zip(row['seeds'], row['top1']))
            diffs = [mine[s] - ref[s] for s in seeds]
            paired[dtype] = dict(paired_ci(diffs), seeds=seeds, diffs=diffs)
    return {'per_dtype': per, 'paired': paired}


def format_table(records, stats):
    """The study's report as Markdown text (what the command prints and writes to table.md)."""
    per, paired = stats['per_dtype'], stats['paired']
    seeds = sorted({r['config']['seed'] for r in records})
    lines = ['Final validation top-1 (%) per run', '',
             '| dtype | ' + ' | '.join('seed %d' % s for s in seeds) + ' | mean | std |',
             '|---|' + '---:|' * (len(seeds) + 2)]
    for dtype, row in per.items():
        cells = dict(zip(row['seeds'], row['top1']))
        lines.append('| %s | %s | %.2f | %s |' % (
            row['label'], ' | '.join('%.2f' % cells[s] if s in cells else '' for s in seeds),
            row['mean'], '%.2f' % row['std'] if row['std'] is not None else 'n/a'))
    lines += ['', 'Paired difference (dtype - float32, points), same seed', '',
              '| dtype | ' + ' | '.join('seed %d' % s for s in seeds)
              + ' | mean | std | 95% CI of the mean |', '|---|' + '---:|' * (len(seeds) + 3)]
    for dtype, p in paired.items():
        cells = dict(zip(p['seeds'], p['diffs']))
        ci = ('[%+.2f, %+.2f] (t=%.2f, df=%d)' % (p['low'], p['high'], p['t'], p['n'] - 1)
              if p['half_width'] is not None else 'n/a (one seed)')
        lines.append('| %s | %s | %+.2f | %s | %s |' % (
            per[dtype]['label'],
            ' | '.join('%+.2f' % cells[s] if s in cells else '' for s in seeds), p['mean'],
            '%.2f' % p['std'] if p['std'] is not None else 'n/a', ci))
    scaled = [r for r in records if r['loss_scale']['first_scale'] not in (None, 1.0)
              or r['skipped_steps']]
    if scaled:
        lines += ['', 'Loss-scale events', '',
                  '| run | steps | skipped steps | first skipped | scale start -> final | '
                  'scale changes |', '|---|---:|---:|---|---|---:|']
        for r in sorted(scaled, key=lambda r: r['name']):
            ev = r['loss_scale']
            lines.append('| %s | %d | %d | %s | %g -> %g | %d |' % (
                r['name'], r['steps'], r['skipped_steps'],
                ', '.join(str(s) for s in ev['skipped_steps'][:5])
                + (', ...' if len(ev['skipped_steps']) > 5 else ''),
                ev['first_scale'], ev['final_scale'], len(ev['scale_changes'])))
    lines += ['', 'Cost per run (means; wall and CPU seconds include start-up and validation, '
              'CPU = user + system of the run\'s process, runs resumed after an interruption '
              'left out; training seconds and img/s exclude validation)', '',
              '| dtype | runs | wall s | CPU s | training s | training img/s |',
              '|---|---:|---:|---:|---:|---:|']
    for dtype, row in per.items():
        lines.append('| %s | %d | %s | %s | %.0f | %.0f |' % (
            row['label'], len(row['top1']),
            '%.0f' % row['wall_s_mean'] if row['wall_s_mean'] is not None else 'n/a',
            '%.0f' % row['cpu_s_mean'] if row['cpu_s_mean'] is not None else 'n/a',
            row['train_s_mean'], row['img_per_sec_mean']))
    return '\n'.join(lines) + '\n'


def plot_curves(records, png):
    """Validation top-1 per epoch of every run, overlaid (one colour per dtype, one line per
    seed); the right panel zooms on the second half of training. Writes ``png``."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    colours = {'float32': 'tab:blue', 'bfloat16': 'tab:orange', 'float16': 'tab:green'}
    styles = {'float32': '-', 'bfloat16': '--', 'float16': ':'}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    by = {}
    for r in records:
        by.setdefault(r['config']['dtype'], []).append(r)
    for dtype, rs in by.items():
        label = dtype_label(rs)
        for i, r in enumerate(sorted(rs, key=lambda r: r['config']['seed'])):
            x = np.arange(1, len(r['val_top1']) + 1)
            y = 100 * np.asarray(r['val_top1'], dtype=float)
            for ax in axes:
                ax.plot(x, y, color=colours.get(dtype, 'tab:gray'), alpha=0.75, lw=1.2,
                        ls=styles.get(dtype, '-'),
                        marker='.', label='%s, %d seed(s)' % (label, len(rs)) if i == 0
                        else None)
    epochs = max(len(r['val_top1']) for r in records)
    tail = [100 * v for r in records for v in r['val_top1'][epochs // 2:]]
    axes[1].set_xlim(max(0.7, epochs // 2 + 0.7), epochs + 0.3)
    if tail:
        axes[1].set_ylim(min(tail) - 0.2, max(tail) + 0.2)
    for ax, title in zip(axes, ('all epochs', 'second half (zoom)')):
        ax.set_xlabel('epoch')
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel('validation top-1 (%)')
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(loc='lower right', fontsize=8)
    model = records[0]['config']['model']
    fig.suptitle('%s on Fashion-MNIST: validation top-1 of every run' % model)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def format_header(records, command):
    """Where the runs ran: the command, the machines and the commits of the records."""
    machines = sorted({'%s, %d logical cores, avx512_bf16 %s' % (
        r['machine']['cpu'], r['machine']['cores'],
        'yes' if r['machine']['avx512_bf16'] else 'no') for r in records})
    commits = sorted({str(r['commit']) for r in records})
    c = records[0]['config']
    cap = (' (capped at %d batches per epoch)' % c['max_train_batches']
           if c['max_train_batches'] else '')
    return ('Command: `%s`\n\nModel %s, %d epochs of %d training images%s (batch %d, %s, '
            'peak lr %g with %g warm-up epoch(s), cosine to 0, wd %g), validated on %d test '
            'images after every epoch.\n\nMachine: %s. Commits of the runs: %s.\n\n'
            % (command, c['model'], c['epochs'], c['num_train'], cap, c['batch_size'],
               c['optimizer'], c['lr'], c['warmup_epochs'], c['wd'], c['num_val'],
               '; '.join(machines), ', '.join(commits)))


def report(records, out, log=print, command='python -m benchmarks.accuracy'):
    """Print the table, write ``OUT/table.md``, ``OUT/results.json`` and ``OUT/curves.png``;
    return the statistics (:func:`analyse`)."""
    stats = analyse(records)
    write_report(out, format_header(records, command) + format_table(records, stats), stats,
                 lambda png: plot_curves(records, png), log)
    return stats


def write_report(out, text, stats, plot, log=print):
    """Print ``text`` and write it to ``OUT/table.md``, ``stats`` to ``OUT/results.json`` and
    ``plot(path)``'s figure to ``OUT/curves.png`` (both studies' report files)."""
    log(text)
    with open(os.path.join(out, 'table.md'), 'w') as f:
        f.write(text)
    with open(os.path.join(out, 'results.json'), 'w') as f:
        json.dump(stats, f, indent=1)
    plot(os.path.join(out, 'curves.png'))
    log('written: %s' % ', '.join(os.path.join(out, n)
                                  for n in ('table.md', 'results.json', 'curves.png')))


def recorded(args):
    """The records in ``OUT/runs`` made with the study's configuration, in plan order."""
    found = []
    for dtype, seed in planned_runs(args):
        record = load_record(os.path.join(args.out, 'runs', run_name(args.model, dtype, seed)
                                          + '.json'), run_config(args, dtype, seed))
        if record is not None:
            found.append(record)
    return found


def main(argv=None, log=print):
    """Run the study (the runs not yet recorded), then report; returns the statistics.

    Raises SystemExit(2) when the data is missing, RuntimeError when a run fails.
    """
    args = build_parser().parse_args(argv)
    for rec in (args.rec_train, args.rec_val):
        if not os.path.isfile(rec) or not os.path.isfile(os.path.splitext(rec)[0] + '.idx'):
            log('error: %s (+ .idx) not found; write it with `python '
                'scripts/prepare_fashion_mnist.py --out data/fashion-mnist`' % rec)
            raise SystemExit(2)
    os.makedirs(os.path.join(args.out, 'runs'), exist_ok=True)
    if not args.report_only:
        plan = planned_runs(args)
        for dtype, seed in plan:
            run_one(args, dtype, seed, log=log)
    records = recorded(args)
    if not records:
        log('no runs recorded in %s' % os.path.join(args.out, 'runs'))
        return None
    argv = sys.argv[1:] if argv is None else argv
    return report(records, args.out, log=log,
                  command=' '.join(['python -m benchmarks.accuracy'] + list(argv)))


if __name__ == '__main__':
    main()
