"""The parent side: the environment of the worker processes, running one, and running every
mode interleaved over the repeats.

Every measurement runs in a fresh ``python -m benchmarks.worker`` process (see
:mod:`benchmarks.worker`) with the same environment; the directory that holds the
``benchmarks`` package is put first on the worker's ``PYTHONPATH``, so the worker imports this
checkout's ``benchmarks`` (and, beside it, ``mxmp``) from any working directory.
"""
import json
import logging
import os
import platform
import subprocess
import sys
import time

import numpy as np

from benchmarks import peak as bench_peak
from benchmarks.modes import MODES, mode_label
from benchmarks.stats import add_ratios, aggregate, loss_summary

LOG = logging.getLogger('benchmark')
#: The directory holding the ``benchmarks`` package (the repository root).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Environment variables recorded in the JSON and passed unchanged to every subprocess.
THREAD_VARS = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')


def child_env(threads):
    """The environment of every subprocess: the parent's, with the thread counts fixed."""
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = str(threads)
    return env


def run_child(spec, env, log_path, result_path, timeout):
    """Run one worker process; returns its result dict (a failed one if it crashed or timed
    out)."""
    if os.path.exists(result_path):
        os.remove(result_path)
    cmd = [sys.executable, '-m', 'benchmarks.worker', '--child-spec', json.dumps(spec),
           '--child-result', result_path]
    env = dict(env, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [env.get('PYTHONPATH')] if p]))
    start = time.perf_counter()
    with open(log_path, 'w') as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - start
    if rc == 0 and os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
    else:
        with open(log_path) as f:
            tail = [l.strip() for l in f if l.strip()]
        why = 'timed out after %d s' % timeout if rc is None else 'exit code %s' % rc
        result = {'status': 'failed', 'stage': 'process',
                  'error': 'subprocess %s; last log line: %s' % (why, tail[-1] if tail else '')}
    result['wall_s'] = wall
    result['log'] = log_path
    return result


#: Prefixes of the environment variables a run records: MXNet's, the thread counts', and
#: glibc's malloc tunables (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``: they decide
#: whether the bfloat16 FullyConnected backward's per-call oneDNN scratchpads page-fault every
#: step, docs/benchmark.md "Why the bfloat16 FullyConnected backward runs 1.77x"), and
#: ``MXMP_MALLOC`` (``default``: mxmp leaves glibc's malloc untuned).
RECORDED_ENV = ('MXNET_', 'OMP_', 'MKL_', 'KMP_', 'MALLOC_', 'MXMP_MALLOC')


def machine_info(threads):
    """CPU model, AVX-512 flags, core count, load average, thread settings and the
    :data:`RECORDED_ENV` variables (for the report)."""
    info = {'platform': platform.platform(), 'cpus': os.cpu_count(), 'threads': threads,
            'loadavg_start': os.getloadavg(),
            'env': {k: v for k, v in os.environ.items()
                    if k.startswith(RECORDED_ENV)}}
    for var in THREAD_VARS:
        info['env'][var] = str(threads)
    try:
        with open('/proc/cpuinfo') as f:
            text = f.read()
        info['cpu_model'] = next((l.split(':', 1)[1].strip() for l in text.splitlines()
                                  if l.startswith('model name')), None)
        flags = next((l.split(':', 1)[1].split() for l in text.splitlines()
                      if l.startswith('flags')), [])
        info['avx512_flags'] = sorted(f for f in set(flags) if f.startswith('avx512'))
    except OSError:
        info['cpu_model'], info['avx512_flags'] = None, None
    return info


def gpu_available():
    """Number of CUDA GPUs MXNet sees (0 without CUDA or without a CUDA build)."""
    try:
        import mxnet as mx
        return mx.context.num_gpus()
    except Exception:  # pylint: disable=broad-except  (a CPU build or a missing driver)
        return 0


def run_benchmark(args, config, env, out_dir):
    """Every (phase, batch, mode) of ``args`` in its own process, interleaved ``args.repeats``
    times, with a GEMM peak process per repeat and the loss check at the end.

    Args:
        args (argparse.Namespace): the parsed and checked flags of ``scripts/benchmark.py``.
        config (dict): the configuration recorded in the report (also each worker's spec).
        env (dict): the environment of every worker (:func:`child_env`).
        out_dir (str): absolute output directory; worker logs go to ``out_dir/logs``.

    Returns:
        dict: the report without ``config``, ``machine``, ``total_s`` and ``files``: ``rows``
        (one per phase, batch and mode, with ratios and percent of peak), ``peaks``,
        ``lp_kernels_available`` and, if ``args.loss_steps``, ``loss_check``.
    """
    runs = [(phase, batch, mode) for phase in args.phases for batch in args.batch_size
            for mode in MODES if mode in args.modes and phase in MODES[mode][1]]
    LOG.info('%d runs x %d repeats, %d threads each, outputs in %s', len(runs), args.repeats,
             int(env['OMP_NUM_THREADS']), out_dir)
    results = {run: [] for run in runs}
    peak_runs = []
    for repeat in range(args.repeats):
        if args.gemm_size:
            spec = dict(config, mode='peak', phase='-', batch_size=0, output_dir=out_dir,
                        gemm_size=args.gemm_size)
            name = 'gemm_peak_r%d' % repeat
            res = run_child(spec, env, os.path.join(out_dir, 'logs', name + '.log'),
                            os.path.join(out_dir, 'logs', name + '.json'), args.timeout)
            peak_runs.append(res)
            LOG.info('GEMM peak %d^3: %s', args.gemm_size, ', '.join(
                '%s %s' % (d, '%.1f GFLOP/s' % p['gflops_max'] if p['status'] == 'ok'
                           else p['status']) for d, p in res.get('peaks', {}).items())
                     if res['status'] == 'ok' else 'FAILED: %s' % res.get('error'))
        for phase, batch, mode in runs:
            previous = results[(phase, batch, mode)]
            if previous and previous[0]['status'] != 'ok':
                continue  # deterministic failure: not re-run
            spec = dict(config, mode=mode, phase=phase, batch_size=batch, output_dir=out_dir)
            name = '%s_bs%d_%s_r%d' % (phase, batch, mode, repeat)
            res = run_child(spec, env, os.path.join(out_dir, 'logs', name + '.log'),
                            os.path.join(out_dir, 'logs', name + '.json'), args.timeout)
            previous.append(res)
            LOG.info('%-5s batch %-3d %-24s %s', phase, batch, mode + (' (emulated)'
                     if res.get('emulated') else ''),
                     '%.2f %s/s median, peak RSS %.0f MiB' % (np.median(res['img_per_s']),
                                                              config.get('unit', 'img'),
                                                              res['peak_rss_mib'])
                     if res['status'] == 'ok' else 'FAILED: %s' % res.get('error'))
    rows = []
    for (phase, batch, mode), rs in results.items():
        row = aggregate(rs)
        row.update(phase=phase, batch_size=batch, mode=mode,
                   label=mode_label(mode, args.dtype, row['emulated']) +
                   (' (fused)' if row.get('fused') and mode.startswith('mxmp') else ''))
        rows.append(row)
    add_ratios(rows)
    peaks = bench_peak.aggregate_peaks(peak_runs, ('float32', args.dtype)) if peak_runs \
        else {}
    bench_peak.add_percent_of_peak(rows, peaks, args.dtype)
    report = {'rows': rows, 'peaks': peaks,
              'lp_kernels_available': next((r['lp_kernels_available'] for r in rows
                                            if r.get('lp_kernels_available') is not None), None)}
    if args.loss_steps:
        spec = dict(config, mode='loss_check', phase='train', batch_size=args.batch_size[0],
                    output_dir=out_dir)
        LOG.info('loss check: %d steps, float32 vs mxmp', args.loss_steps)
        res = run_child(spec, env, os.path.join(out_dir, 'logs', 'loss_check.log'),
                        os.path.join(out_dir, 'logs', 'loss_check.json'), args.timeout)
        report['loss_check'] = loss_summary(res)
    return report
