#!/usr/bin/env python3
"""Speed, memory and cast counts of mxmp against float32 and ``mxnet.contrib.amp``.

The flags and ``main``; the modes, the fresh process per measurement, the statistics, the
tables and the chart are in the ``benchmarks`` package beside ``scripts/`` (its docstring
describes every mode and output; docs/benchmark.md the results).

Examples::

    python scripts/benchmark.py --quick
    python scripts/benchmark.py --model resnet50_v1 --batch-size 1 32 --repeats 3
    python scripts/benchmark.py --dtype float16 --ctx gpu
    python scripts/benchmark.py --profile --batch-size 16 --iters 5
    python scripts/benchmark.py --model bert_base --batch-size 8 --seq-len 128 --threads 1
    python scripts/benchmark.py --model bert_base --batch-size 8 --seq-len 128 --threads 1 2
    python scripts/benchmark.py --phases infer --batch-size 1 --threads 1 2   # latency
"""
import argparse
import json
import logging
import os
import sys
import time

# The benchmarks/ package sits beside scripts/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import peak as bench_peak  # noqa: E402
from benchmarks import profile as bench_profile  # noqa: E402
from benchmarks import runner  # noqa: E402
from benchmarks import scaling  # noqa: E402
from benchmarks.charts import bar_chart  # noqa: E402
from benchmarks.modes import (BERT_DEFAULT_MODES, BERT_MODEL_NAMES,  # noqa: E402
                              BERT_PROFILE_MODES, DEFAULT_MODES, DEFAULT_SENTENCE_LEN,
                              DEFAULT_SEQ_LEN, MIN_ITERS, MODELS, MODES, PHASES, PROFILE_MODES,
                              QUICK, TRANSFORMER_DEFAULT_MODES, TRANSFORMER_MODEL_NAMES,
                              BenchmarkError, mode_label)
from benchmarks.workloads import is_bert, is_transformer, unit_of  # noqa: E402
from benchmarks.report import markdown  # noqa: E402

LOG = logging.getLogger('benchmark')


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description='Training and inference speed (images/s), peak memory (MiB) and cast counts '
                    'of mxmp vs float32 and mxnet.contrib.amp; one fresh process per run.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument('--model', default='resnet50_v1',
                   help='GluonCV model-zoo name: %s; any other name of '
                        'gluoncv.model_zoo.get_model_list() is accepted for smoke tests (e.g. '
                        'cifar_resnet20_v1 with --input-size 32); or a BERT sentence '
                        'classifier with random weights: %s (bert_tiny: 2 layers of 64 units, '
                        'a smoke configuration; needs the optional extra: pip install -e '
                        '.[bert]); or an encoder-decoder transformer (GluonNLP encoder and '
                        'decoder, same extra) on sentence pairs of varying length: %s '
                        '(transformer_nmt: model size 512, feed-forward 2048, 4+4 layers; '
                        'throughput in sentences/s)' % (', '.join(MODELS),
                                                         ', '.join(BERT_MODEL_NAMES),
                                                         ', '.join(TRANSFORMER_MODEL_NAMES)))
    p.add_argument('--batch-size', type=int, nargs='+', default=[32], help='batch sizes')
    p.add_argument('--input-size', type=int, default=224, help='image height = width (pixels)')
    p.add_argument('--seq-len', type=int, default=None,
                   help='BERT models: tokens per sequence (1-512, default %d; throughput in '
                        'sequences/s); transformers: the longest sentence (default %d; '
                        'lengths are drawn from 8 to it); image models: not allowed'
                        % (DEFAULT_SEQ_LEN, DEFAULT_SENTENCE_LEN))
    p.add_argument('--classes', type=int, default=1000, help='output classes of the model')
    p.add_argument('--warmup', type=int, default=3, help='untimed iterations per run (>= 1)')
    p.add_argument('--iters', type=int, default=10, help='timed iterations per run (>= %d)'
                   % MIN_ITERS)
    p.add_argument('--repeats', type=int, default=3,
                   help='interleaved repeats of every mode (A B C A B C ...); one repeat once '
                        'read 0.63x where three read 1.29x on a shared machine')
    p.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float16'),
                   help='target dtype (float16 needs --ctx gpu for real kernels)')
    p.add_argument('--ctx', default='cpu', choices=('cpu', 'gpu'),
                   help='device; gpu exits with a message when there is no CUDA GPU')
    p.add_argument('--emulate', default='auto', choices=('auto', 'yes', 'no'),
                   help='mxmp modes: emulate the target dtype in float32 kernels; auto = when '
                        'mxmp.lp_kernels_available(dtype, ctx) is False')
    p.add_argument('--phases', nargs='+', default=list(PHASES), choices=PHASES)
    p.add_argument('--modes', nargs='+', default=None, choices=list(MODES),
                   help='modes to run (float32 is always run: it is the reference; '
                        'mxmp_unfused and mxmp_cast_params_unfused, inference without fusion, '
                        "and mxmp_mxnet_kernels, MXNet's kernels where mxmp's library would run, "
                        'only when named); default: '
                        '%s; for BERT: %s; for the transformers: %s'
                        % (' '.join(DEFAULT_MODES), ' '.join(BERT_DEFAULT_MODES),
                           ' '.join(TRANSFORMER_DEFAULT_MODES)))
    p.add_argument('--residual-dtype', default='target', choices=('float32', 'target'),
                   help="mxmp modes: Policy(residual_dtype=...), the dtype of a LayerNorm's "
                        'output for its consumers (the residual stream of a post-LayerNorm '
                        'transformer such as BERT)')
    p.add_argument('--gemm-size', type=int, default=bench_peak.DEFAULT_SIZE,
                   help='M = N = K of the GEMM whose GFLOP/s is the peak (once per repeat, '
                        'float32 and the target dtype); 0 skips it (no %% of peak)')
    p.add_argument('--profile', action='store_true',
                   help='instead of the benchmark: per-operator time of training (mx.profiler, '
                        'bulk execution off) for %s side by side, at the first --batch-size, '
                        'over --iters iterations (BERT: %s; --modes chooses others)' % (', '.join(PROFILE_MODES),
                                                                ', '.join(BERT_PROFILE_MODES)))
    p.add_argument('--profile-phase', default='train', choices=PHASES,
                   help='--profile: the phase profiled (a training step or an inference call)')
    p.add_argument('--loss-steps', type=int, default=20,
                   help='SGD steps of the loss check (0: skip it)')
    p.add_argument('--threads', type=int, nargs='+', default=None,
                   help='OMP_NUM_THREADS/MKL_NUM_THREADS of every run (default: the current '
                        'OMP_NUM_THREADS, else the number of cores); several counts (e.g. '
                        '--threads 1 2) run everything once per count, in OUTPUT_DIR/threads<N>/'
                        ' (the loss check at the first count only), then print and write '
                        'scaling.md: the ratio against float32 per count, the time of one batch '
                        '(batch 1: the latency of a call) and the speed-up from the first count '
                        '(with --profile: of each operator, and projection.md: each mode '
                        'projected to %s threads, Amdahl\'s law per operator; python -m '
                        'benchmarks.scaling OUTPUT_DIR --project N... for other counts)'
                        % ' '.join(map(str, scaling.PROJECT_TO)))
    p.add_argument('--timeout', type=float, default=3600, help='seconds per subprocess')
    p.add_argument('--output-dir', default='runs/benchmark', help='where the outputs go')
    p.add_argument('--quick', action='store_true',
                   help='smoke configuration: %s (explicit flags still win)' %
                   ', '.join('%s=%s' % kv for kv in QUICK.items()))
    p.add_argument('--child-spec', help=argparse.SUPPRESS)
    p.add_argument('--child-result', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        given = argv if argv is not None else sys.argv[1:]
        explicit = {a.dest for a in p._actions for s in a.option_strings
                    if any(g == s or g.startswith(s + '=') for g in given)}
        for key, value in QUICK.items():
            if key not in explicit:
                setattr(args, key, value)
    return args


def check_args(args):
    """Raise BenchmarkError for arguments that cannot give a measurement."""
    if args.iters < MIN_ITERS:
        raise BenchmarkError('--iters %d: at least %d timed iterations are needed for a median '
                             'and a spread; pass --iters %d or more' % (args.iters, MIN_ITERS,
                                                                        MIN_ITERS))
    if args.warmup < 1:
        raise BenchmarkError('--warmup %d: the first iteration builds the graph and allocates '
                             'memory, it must not be timed; pass --warmup 1 or more' % args.warmup)
    bert, transformer = is_bert(args.model), is_transformer(args.model)
    if args.modes is None:
        args.modes = list(BERT_DEFAULT_MODES if bert else TRANSFORMER_DEFAULT_MODES
                          if transformer else DEFAULT_MODES)
    if args.seq_len is None:
        args.seq_len = DEFAULT_SENTENCE_LEN if transformer else DEFAULT_SEQ_LEN
    elif not (bert or transformer):
        raise BenchmarkError('--seq-len is for the text models (%s); %s takes --input-size'
                             % (', '.join(BERT_MODEL_NAMES + TRANSFORMER_MODEL_NAMES),
                                args.model))
    if args.repeats < 1 or min(args.batch_size) < 1 or \
            (args.input_size < 32 and not (bert or transformer)):
        raise BenchmarkError('--repeats and --batch-size must be >= 1 and --input-size >= 32 '
                             '(the models downsample by 32)')
    if args.loss_steps < 0:
        raise BenchmarkError('--loss-steps must be >= 0')
    if args.threads is not None and (min(args.threads) < 1 or
                                     len(set(args.threads)) != len(args.threads)):
        raise BenchmarkError('--threads %s: give distinct thread counts >= 1, e.g. --threads 1 2'
                             % ' '.join(map(str, args.threads)))
    if bert:
        from benchmarks.bert import MAX_LENGTH, require_gluonnlp
        require_gluonnlp()
        if not 1 <= args.seq_len <= MAX_LENGTH:
            raise BenchmarkError('--seq-len %d: BERT takes 1 to %d tokens'
                                 % (args.seq_len, MAX_LENGTH))
    elif transformer:
        from benchmarks.transformer import MAX_POSITIONS
        from benchmarks.bert import require_gluonnlp
        require_gluonnlp()
        if not 1 <= args.seq_len <= MAX_POSITIONS:
            raise BenchmarkError('--seq-len %d: the transformer takes sentences of 1 to %d '
                                 'tokens' % (args.seq_len, MAX_POSITIONS))
    elif args.model not in MODELS:
        from gluoncv.model_zoo import get_model_list
        if args.model not in get_model_list():
            raise BenchmarkError('--model %s is not in the GluonCV model zoo; use one of %s (or '
                                 'see gluoncv.model_zoo.get_model_list())'
                                 % (args.model, ', '.join(MODELS)))
    if 'float32' not in args.modes:
        args.modes = ['float32'] + list(args.modes)


def gpu_available():
    """Number of CUDA GPUs MXNet sees (0 without CUDA or without a CUDA build)."""
    try:
        import mxnet as mx
        return mx.context.num_gpus()
    except Exception:  # pylint: disable=broad-except  (a CPU build or a missing driver)
        return 0


def main(argv=None):
    args = parse_args(argv)
    modes_given = args.modes is not None   # check_args fills in the default modes
    if args.child_spec:  # a worker started by an older runner: same as python -m benchmarks.worker
        from benchmarks.worker import child_main
        return child_main(args.child_spec, args.child_result)
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(message)s', datefmt='%H:%M:%S')
    try:
        check_args(args)
    except BenchmarkError as err:
        LOG.error('%s', err)
        return 2
    if args.ctx == 'gpu' and not runner.gpu_available():
        LOG.warning('--ctx gpu: MXNet sees no CUDA GPU (no GPU, no driver, or a CPU build of '
                    'MXNet); nothing measured. Run on a GPU machine with mxnet-cu112, or use '
                    '--ctx cpu.')
        return 0
    counts = args.threads or [int(os.environ.get('OMP_NUM_THREADS') or os.cpu_count())]
    out_dir = os.path.abspath(args.output_dir)
    if len(counts) == 1:
        return run_at(args, argv, counts[0], out_dir, modes_given)
    reports, status = {}, 0
    for threads in sorted(counts):
        LOG.info('== %d threads', threads)
        sub = os.path.join(out_dir, 'threads%d' % threads)
        path = os.path.join(sub, 'profile.json' if args.profile else 'benchmark.json')
        if os.path.exists(path):
            os.remove(path)   # an earlier run's report is never lined up with this one's
        status = max(status, run_at(args, argv, threads, sub, modes_given))
        if os.path.exists(path):
            with open(path) as f:
                reports[threads] = json.load(f)
        args.loss_steps = 0   # numerics: the same at every thread count
    if len(reports) < 2:
        LOG.error('fewer than two thread counts gave a report: no scaling table')
        return status or 1
    text = scaling.write('profile' if args.profile else 'benchmark', reports, out_dir,
                         ' '.join(['python', 'scripts/benchmark.py'] +
                                  (argv if argv is not None else sys.argv[1:])),
                         unit=unit_of(args.model))
    print(text)
    LOG.info('wrote %s', os.path.join(out_dir, 'scaling.md'))
    if args.profile:   # the same as python -m benchmarks.scaling OUTPUT_DIR --project 8 16 32 64
        try:
            proj = scaling.project(reports, list(scaling.PROJECT_TO))
        except ValueError as err:
            LOG.warning('no projection: %s', err)
            return status
        text = scaling.projection_text(reports, proj)
        with open(os.path.join(out_dir, 'projection.md'), 'w') as f:
            f.write(text)
        print(text)
        LOG.info('wrote %s', os.path.join(out_dir, 'projection.md'))
    return status


def run_at(args, argv, threads, out_dir, modes_given):
    """The benchmark (or ``--profile``) at ``threads`` threads into ``out_dir``; exit code."""
    os.makedirs(os.path.join(out_dir, 'logs'), exist_ok=True)
    env = runner.child_env(threads)
    machine = runner.machine_info(threads)
    config = {k: getattr(args, k) for k in ('model', 'batch_size', 'input_size', 'seq_len',
                                            'classes', 'warmup', 'iters', 'repeats', 'dtype',
                                            'ctx', 'emulate', 'phases', 'modes', 'loss_steps',
                                            'quick', 'gemm_size', 'profile_phase',
                                            'residual_dtype')}
    config['unit'] = unit_of(args.model)
    config['command'] = ' '.join(['python', 'scripts/benchmark.py'] +
                                 (argv if argv is not None else sys.argv[1:]))
    if args.profile:
        default = BERT_PROFILE_MODES if is_bert(args.model) else PROFILE_MODES
        # --modes, when given, chooses the profiled modes (float32 first: the reference)
        chosen = ['float32'] + [m for m in args.modes if m != 'float32'] if modes_given \
            else default
        return bench_profile.run_profile(config, env, machine, out_dir, args.timeout,
                                         runner.run_child, mode_label, tuple(chosen))
    start = time.perf_counter()
    report = {'config': config, 'machine': machine}
    report.update(runner.run_benchmark(args, config, env, out_dir))
    report['total_s'] = time.perf_counter() - start
    machine['loadavg_end'] = os.getloadavg()
    paths = {k: os.path.join(out_dir, 'benchmark.' + k) for k in ('json', 'md', 'png')}
    report['files'] = paths
    with open(paths['json'], 'w') as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(paths['md'], 'w') as f:
        f.write(text)
    bar_chart(report, paths['png'])
    print(text)
    LOG.info('wrote %s', ', '.join(paths.values()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
