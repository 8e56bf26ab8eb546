"""The machine's own limit: GEMM throughput in float32 and in the target dtype, through MXNet.

A GEMM of ``size`` x ``size`` x ``size`` (default 2048: large enough to saturate a core's
vector units, small enough for 1-2 s per dtype) runs as ``FullyConnected(x, w, no_bias=True)``,
the oneDNN inner product that MXNet's own layers use, in float32 and in the target dtype (inputs
``amp_cast`` once, outside the timing), with the same thread count as the measurements. It
performs ``2 * size**3`` FLOP. The peak is the largest GFLOP/s over the timed calls: other load
can only slow a GEMM down, so the fastest call is the best estimate of what the hardware does
(the median is reported too; far below the max means the machine was busy). Where the target dtype has no kernels (bfloat16 without AVX-512, float16 on a
CPU) its peak is reported as unavailable, with the reason, and rows of that dtype get no
percentage.

Percent of peak of a row::

    100 * images/s * FLOP per image * (3 if training else 1) / (peak GFLOP/s * 1e9)

against the float32 peak for float32 rows and the target-dtype peak for low-precision rows.
"""
import time

import numpy as np

from .flops import TRAIN_FACTOR

__all__ = ['measure_gemm_peak', 'percent_of_peak', 'peak_dtype_of', 'aggregate_peaks',
           'add_percent_of_peak', 'limit_markdown', 'DEFAULT_SIZE']

DEFAULT_SIZE = 2048


def measure_gemm_peak(dtype, ctx, size=DEFAULT_SIZE, warmup=2, iters=5):
    """GFLOP/s of a ``size``-cubed GEMM in ``dtype`` on ``ctx`` (mxnet.Context).

    Args:
        dtype (str): ``'float32'``, ``'bfloat16'`` or ``'float16'``.
        ctx (mxnet.Context): the device.
        size (int): M = N = K. Default 2048.
        warmup, iters (int): untimed and timed calls (each followed by ``waitall``).

    Returns:
        dict: ``{'dtype', 'size', 'status': 'ok', 'gflops_median', 'gflops_max', 'gflops'
        (every call), 'flop_per_call'}``, or ``{'dtype', 'status': 'unavailable', 'reason'}``
        when ``dtype`` has no kernels on ``ctx`` (checked with ``mxmp.lp_kernels_available``).
    """
    import mxnet as mx
    import mxmp
    if dtype != 'float32' and not mxmp.lp_kernels_available(dtype, ctx):
        return {'dtype': dtype, 'status': 'unavailable',
                'reason': 'no %s kernels on %s (mxmp.lp_kernels_available is False)'
                          % (dtype, ctx)}
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.uniform(-1, 1, (size, size)), ctx=ctx)
    w = mx.nd.array(rng.uniform(-1, 1, (size, size)), ctx=ctx)
    if dtype != 'float32':
        from mxmp._src.dtypes import mx_dtype as dtype_of
        x, w = (mx.nd.amp_cast(a, dtype=dtype_of(dtype)) for a in (x, w))

    def call():
        mx.nd.FullyConnected(x, w, num_hidden=size, no_bias=True).wait_to_read()

    for _ in range(warmup):
        call()
    flop = 2 * size ** 3
    rates = []
    for _ in range(iters):
        start = time.perf_counter()
        call()
        rates.append(flop / (time.perf_counter() - start) / 1e9)
    return {'dtype': dtype, 'size': size, 'status': 'ok', 'flop_per_call': flop,
            'gflops': rates, 'gflops_median': float(np.median(rates)),
            'gflops_max': float(np.max(rates))}


def peak_dtype_of(mode, target_dtype):
    """The dtype whose peak a mode is compared with: float32 modes -> float32, others target."""
    return 'float32' if mode.startswith('float32') else target_dtype


def percent_of_peak(img_per_s, flop_per_image, phase, peak_gflops):
    """Percent of ``peak_gflops`` (GFLOP/s) reached at ``img_per_s`` (images/s).

    Args:
        img_per_s (float or None): images per second.
        flop_per_image (int or None): forward FLOP of one image.
        phase (str): ``'train'`` (counted as :data:`~benchmarks.flops.TRAIN_FACTOR` x forward)
            or ``'infer'``.
        peak_gflops (float or None): the peak of the relevant dtype.

    Returns:
        float or None: percent (100 = the GEMM peak); None when any input is missing.
    """
    if not img_per_s or not flop_per_image or not peak_gflops:
        return None
    factor = TRAIN_FACTOR if phase == 'train' else 1
    return 100.0 * img_per_s * flop_per_image * factor / (peak_gflops * 1e9)


def aggregate_peaks(runs, dtypes):
    """One peak per dtype from the per-repeat GEMM processes: median of every timed call.

    Args:
        runs (list of dict): results of the peak processes (``{'status', 'peaks': {dtype:
            measure_gemm_peak(...)}}``, or a failed one with ``'error'``).
        dtypes (iterable of str): the dtypes to report.

    Returns:
        dict: dtype -> ``{'status': 'ok', 'size', 'gflops_median', 'gflops_max', 'calls'}``, or
        ``{'status': 'unavailable' or 'failed', 'reason'}``.
    """
    out = {}
    for dtype in dtypes:
        results = [r['peaks'][dtype] for r in runs if r['status'] == 'ok']
        ok = [p for p in results if p['status'] == 'ok']
        if ok:
            calls = np.concatenate([p['gflops'] for p in ok])
            out[dtype] = {'dtype': dtype, 'status': 'ok', 'size': ok[0]['size'],
                          'gflops_median': float(np.median(calls)),
                          'gflops_max': float(calls.max()), 'calls': int(calls.size)}
        elif results:
            out[dtype] = {'dtype': dtype, 'status': 'unavailable', 'reason': results[0]['reason']}
        else:
            failed = next((r for r in runs if r['status'] != 'ok'), {})
            out[dtype] = {'dtype': dtype, 'status': 'failed', 'reason': failed.get('error')}
    return out


def add_percent_of_peak(rows, peaks, target_dtype):
    """Give each benchmark row ``peak_dtype``, ``peak_gflops`` and ``percent_of_peak``.

    Args:
        rows (list of dict): rows with ``mode``, ``phase``, ``img_per_s_median``,
            ``flop_per_image``, ``emulated``.
        peaks (dict): from :func:`aggregate_peaks`.
        target_dtype (str): the run's target dtype.

    ``percent_of_peak`` is None where the peak is unavailable, the row failed, or the row is
    emulated (emulation runs float32 kernels: its speed is no dtype's).
    """
    for row in rows:
        row['peak_dtype'] = peak_dtype_of(row['mode'], target_dtype)
        row['peak_gflops'] = peaks.get(row['peak_dtype'], {}).get('gflops_max')
        row['percent_of_peak'] = None if row.get('emulated') else percent_of_peak(
            row.get('img_per_s_median'), row.get('flop_per_image'), row['phase'],
            row['peak_gflops'])
    return rows


def limit_markdown(peaks, target_dtype, threads):
    """Markdown lines: the GEMM peak of float32 and the target dtype (from aggregate_peaks)."""
    lines = ['## The limit: GEMM peak of this machine (%d threads, measured in this run)'
             % threads, '', '| dtype | GEMM | peak GFLOP/s (max) | median | x float32 | status |',
             '|---|---|---|---|---|---|']
    base = peaks.get('float32', {}).get('gflops_max')
    for dtype in ('float32', target_dtype):
        p = peaks.get(dtype)
        if p is None:
            continue
        if p['status'] == 'ok':
            lines.append('| %s | %d^3 | %.1f | %.1f | %s | ok (%d calls) |' % (
                dtype, p['size'], p['gflops_max'], p['gflops_median'],
                '%.2fx' % (p['gflops_max'] / base) if base else '-', p['calls']))
        else:
            lines.append('| %s | - | - | - | - | %s: %s |' % (dtype, p['status'], p['reason']))
    if not peaks:
        lines.append('| - | - | - | - | - | not measured (--gemm-size 0) |')
    return lines + ['']
