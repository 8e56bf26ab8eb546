"""The transformer accuracy study: a GPT-style character model on the King James Bible, float32
against bfloat16 and float16, paired by seed.

One command (beside ``python -m benchmarks.accuracy``, the image study)::

    python -m benchmarks.accuracy_transformer          # the committed study (docs/accuracy.md)

trains :mod:`benchmarks.gpt` once per (dtype, seed), each run in its own fresh Python process
(``--jobs`` at a time), with the same flags for every dtype: runs of one seed start from the
same weights and see the same windows in the same order, so their difference is the precision.
bfloat16 runs oneDNN's bfloat16 kernels where ``mxmp.lp_kernels_available('bfloat16')`` and is
emulated elsewhere; float16 is emulated on a CPU and has dynamic loss scaling. Each record says
which.

Every run writes its record, ``OUT/runs/gpt-<dtype>-seed<k>.json`` (final validation perplexity,
the curves, loss-scale events, timings, machine, commit), as soon as it finishes; a run whose
record exists with the same configuration is skipped, so an interrupted study resumes where it
stopped (a run killed in the middle starts again: a run costs minutes). The report, printed and
written to ``OUT/table.md``, ``OUT/results.json`` and ``OUT/curves.png``:

* validation perplexity per run, mean and standard deviation per dtype;
* the paired relative difference ``ppl(dtype) / ppl(float32) - 1`` per seed (percent), its mean
  and the 95% confidence interval of the mean (Student's t, :func:`benchmarks.accuracy.paired_ci`);
* the loss-scale events (scale changes, skipped steps) of runs with loss scaling;
* the training and validation curves of every run in one PNG.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

from benchmarks import accuracy
from benchmarks.accuracy import git_commit, machine, parse_seeds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = ('float32', 'bfloat16', 'float16')
# flags of benchmarks.gpt that define a run (with dtype and seed)
TRAIN_FLAGS = ('steps', 'batch_size', 'context', 'units', 'layers', 'heads', 'dropout', 'lr',
               'warmup_steps', 'clip', 'eval_interval', 'curve_windows', 'eval_batch_size',
               'max_val_windows')


def parse_dtypes(text):
    """'float32,bfloat16' -> ('float32', 'bfloat16'); argparse.ArgumentTypeError names the
    choices for anything else."""
    dtypes = tuple(d for d in text.split(',') if d)
    if not dtypes or any(d not in DTYPES[:2] for d in dtypes):
        raise argparse.ArgumentTypeError('%r: give float32 and/or bfloat16, comma-separated'
                                         % text)
    return dtypes


def build_parser():
    from benchmarks import gpt
    p = argparse.ArgumentParser(
        prog='python -m benchmarks.accuracy_transformer',
        description='float32 against bfloat16/float16 perplexity of a small GPT on the King '
                    'James Bible, paired by seed, through benchmarks/gpt.py.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = gpt.build_parser()
    for flag in TRAIN_FLAGS:
        action = next(a for a in defaults._actions if a.dest == flag)
        p.add_argument(action.option_strings[0], type=action.type, default=action.default,
                       help=action.help)
    p.add_argument('--kernels', choices=('default', 'mxnet', 'auto', 'all'), default='default',
                   help="benchmarks.gpt's --kernels for every run (mxmp's operator library; "
                        "with 'auto' or 'all' float32 runs the library's kernels too): a study "
                        "of the library, written to its own --out")
    p.add_argument('--arch', choices=gpt.ARCHS, default='pre-ln',
                   help="benchmarks.gpt's --arch for every run: 'post-ln' is the post-LayerNorm "
                        "model (BERT's block), a study of its own --out")
    p.add_argument('--residual-dtype', choices=('float32', 'target'), default='float32',
                   help="benchmarks.gpt's --residual-dtype for the bfloat16/float16 runs "
                        "(Policy(residual_dtype=...)); float32 runs ignore it")
    p.add_argument('--dtypes', type=parse_dtypes,
                   default=('float32', 'bfloat16'),
                   help='comma-separated dtypes of the --seeds runs (float16 has its own '
                        '--float16-seeds)')
    p.add_argument('--mask-seed-offset', type=int, default=None,
                   help="benchmarks.gpt's --mask-seed SEED + this for every run: other "
                        'Dropout masks, the same weights and windows (the noise of the '
                        'masks alone); a study of its own --out')
    p.add_argument('--reference', default=None,
                   help='another study\'s --out (e.g. docs/accuracy/transformer): the report '
                        'also pairs every run with that study\'s float32 run of its seed')
    p.add_argument('--seeds', type=parse_seeds, default=parse_seeds('0-5'),
                   help='seeds of the float32 and bfloat16 runs, e.g. 0-2 or 0,1,4')
    p.add_argument('--float16-seeds', type=parse_seeds, default=parse_seeds('0-2'),
                   help='seeds of the emulated float16 runs (fewer: a step costs about twice '
                        'float32\'s); "" for none')
    p.add_argument('--jobs', type=int, default=2, help='runs at a time (one thread each)')
    p.add_argument('--out', default=os.path.join('docs', 'accuracy', 'transformer'),
                   help='run records, table.md, results.json and curves.png')
    p.add_argument('--work-dir', default=os.path.join('runs', 'accuracy_transformer'),
                   help='logs and metrics of the runs (not committed)')
    p.add_argument('--report-only', action='store_true',
                   help='train nothing; report the runs recorded in --out')
    return p


def run_name(dtype, seed):
    return 'gpt-%s-seed%d' % (dtype, seed)


def run_config(args, dtype, seed):
    """What identifies a run: dtype, seed and the training flags (stored in its record)."""
    config = {flag: getattr(args, flag) for flag in TRAIN_FLAGS}
    config.update(dtype=dtype, seed=seed)
    if args.kernels != 'default':     # recorded only when set: older records stay valid
        config['kernels'] = args.kernels
    if args.arch != 'pre-ln':         # recorded only when set
        config['arch'] = args.arch
    if args.residual_dtype != 'float32' and dtype != 'float32':   # recorded only when set
        config['residual_dtype'] = args.residual_dtype
    if args.mask_seed_offset is not None:
        config['mask_seed'] = seed + args.mask_seed_offset
    return config


def load_record(path, config):
    """The record at ``path`` when it exists and was made with ``config``; else None."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if record.get('config') == config else None


def train_argv(config, save_dir):
    argv = ['--save-dir', save_dir]
    for key, value in sorted(config.items()):
        if value is not None:
            argv += ['--' + key.replace('_', '-'), str(value)]
    return argv


def loss_scale_events(metrics_path):
    """Skipped steps and loss-scale changes of a run, from its metrics.jsonl.

    Returns a dict: ``skipped_steps`` (step numbers), ``scale_changes`` ([first step that used
    the new scale, new scale]), ``first_scale``, ``last_scale`` (the scale the last step used;
    None without step lines), ``nonfinite_grads`` ([step, {parameter: non-finite entries}] of
    the skipped steps).
    """
    events = accuracy.loss_scale_events(metrics_path)
    events['last_scale'] = events.pop('final_scale')   # the name this study's records use
    return events


def make_record(config, summary, metrics_path, wall_s, cpu_s, commit):
    """A run's record: what the report needs, small enough to commit."""
    keys = ('emulate', 'final_val_loss', 'final_val_ppl', 'curve', 'skipped_steps', 'loss_scale',
            'train_s', 'median_step_s', 'peak_rss_mib', 'parameters', 'vocab_size',
            'train_chars', 'val_chars')
    record = {'config': config, 'name': run_name(config['dtype'], config['seed'])}
    record.update({k: summary[k] for k in keys})
    record.update(loss_scale_events=loss_scale_events(metrics_path), wall_s=wall_s,
                  cpu_s=cpu_s, machine=machine(), commit=commit,
                  finished=datetime.datetime.now(datetime.timezone.utc)
                  .isoformat(timespec='seconds'))
    return record


def planned_runs(args):
    """(dtype, seed) in start order: float32 and bfloat16 of a seed together, seed after seed
    (an interrupted study has complete pairs), then float16."""
    plan = []
    for seed in args.seeds:
        plan += [(dtype, seed) for dtype in DTYPES[:2] if dtype in args.dtypes]
    plan += [('float16', seed) for seed in args.float16_seeds]
    return plan


class _Run:
    """One training process and what its record needs."""

    def __init__(self, args, dtype, seed, log):
        self.config = run_config(args, dtype, seed)
        self.name = run_name(dtype, seed)
        self.path = os.path.join(args.out, 'runs', self.name + '.json')
        self.save_dir = os.path.join(args.work_dir, self.name)
        os.makedirs(self.save_dir, exist_ok=True)
        argv = train_argv(self.config, self.save_dir)
        log('%-24s training: python -m benchmarks.gpt %s' % (self.name, ' '.join(argv)))
        self.commit = git_commit()
        self.log_path = os.path.join(self.save_dir, 'stdout.log')
        env = dict(os.environ, OMP_NUM_THREADS='1', MXNET_CPU_WORKER_NSTREAMS='1')
        env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
        with open(self.log_path, 'wb') as out:
            self.proc = subprocess.Popen([sys.executable, '-m', 'benchmarks.gpt'] + argv,
                                         stdout=out, stderr=subprocess.STDOUT, env=env)
        self.tic = time.time()

    def finish(self, log):
        """Wait for the process, write the record; RuntimeError when the training failed."""
        status = self.proc.wait()
        wall = time.time() - self.tic
        if status != 0:
            with open(self.log_path, errors='replace') as f:
                tail = f.read()[-2000:]
            raise RuntimeError('%s failed with exit status %d; see %s:\n%s'
                               % (self.name, status, self.log_path, tail))
        with open(os.path.join(self.save_dir, 'summary.json')) as f:
            summary = json.load(f)
        cpu = summary.pop('cpu_s', None)
        record = make_record(self.config, summary, os.path.join(self.save_dir, 'metrics.jsonl'),
                             wall, cpu, self.commit)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path + '.tmp', 'w') as f:
            json.dump(record, f, indent=1)
        os.replace(self.path + '.tmp', self.path)
        log('%-24s perplexity %.4f, %.0f s' % (self.name, record['final_val_ppl'], wall))
        return record


def run_all(args, log=print):
    """Train the planned runs without a record, ``args.jobs`` at a time; records of runs done
    are skipped. Raises RuntimeError when a run fails (after the others running finish)."""
    pending, running, errors = [], [], []
    for dtype, seed in planned_runs(args):
        name = run_name(dtype, seed)
        if load_record(os.path.join(args.out, 'runs', name + '.json'),
                       run_config(args, dtype, seed)) is not None:
            log('%-24s done, skipped' % name)
        else:
            pending.append((dtype, seed))
    while pending or running:
        while pending and len(running) < max(1, args.jobs):
            running.append(_Run(args, *pending.pop(0), log=log))
        time.sleep(0.2)
        for run in [r for r in running if r.proc.poll() is not None]:
            running.remove(run)
            try:
                run.finish(log)
            except RuntimeError as err:
                errors.append(err)
                pending.clear()
    if errors:
        raise errors[0]


def recorded(args):
    """The records in ``OUT/runs`` made with the study's configuration, in plan order."""
    found = []
    for dtype, seed in planned_runs(args):
        record = load_record(os.path.join(args.out, 'runs', run_name(dtype, seed) + '.json'),
                             run_config(args, dtype, seed))
        if record is not None:
            found.append(record)
    return found


def main(argv=None, log=print):
    """Run the study (the runs not yet recorded), then report; returns the statistics.

    Raises SystemExit(2) when the King James Bible is not installed (the message names the apt
    command), RuntimeError when a run fails."""
    from benchmarks import gpt, transformer_report
    args = build_parser().parse_args(argv)
    try:
        gpt.load_bible()
    except gpt.DataMissing as err:
        log('error: %s' % err)
        raise SystemExit(2)
    os.makedirs(os.path.join(args.out, 'runs'), exist_ok=True)
    if not args.report_only:
        run_all(args, log=log)
    records = recorded(args)
    if not records:
        log('no runs recorded in %s' % os.path.join(args.out, 'runs'))
        return None
    reference = None
    if args.reference:
        ref_args = argparse.Namespace(**dict(vars(args), kernels='default', out=args.reference,
                                             mask_seed_offset=None, dtypes=('float32',),
                                             float16_seeds=[]))
        reference = [r for r in recorded(ref_args) if r['config']['dtype'] == 'float32']
        if not reference:
            raise ValueError('no float32 runs of this configuration recorded in %s'
                             % os.path.join(args.reference, 'runs'))
    argv = sys.argv[1:] if argv is None else argv
    return transformer_report.report(
        records, args.out, log=log,
        command=' '.join(['python -m benchmarks.accuracy_transformer'] + list(argv)),
        reference=reference, reference_name=args.reference and '%s, %s' % (
            args.reference, transformer_report.dtype_label(reference)))


if __name__ == '__main__':
    main()
