"""scripts/benchmark.py: every mode reported, failures as rows, cast counts, output files.

One small run of the script (cifar_resnet20_v1 at 32x32, batch 2, 1 warm-up + 5 timed
iterations, one thread, 2 loss-check steps; about 10 subprocesses) is shared by the tests. No
timed assertions: only that the numbers exist and agree with mxmp for the same graph.
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / 'scripts' / 'benchmark.py'
MODEL, CLASSES, SIZE = 'cifar_resnet20_v1', 10, 32
ALL_MODES = {'train': ['float32', 'contrib_amp', 'mxmp', 'mxmp_cast_params'],
             'infer': ['float32', 'contrib_amp', 'contrib_amp_cast_params', 'mxmp',
                       'mxmp_cast_params']}


def load_benchmark():
    spec = importlib.util.spec_from_file_location('benchmark_script', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, str(SCRIPT)] + list(args), cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='module')
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('bench')
    proc = run_script('--model', MODEL, '--classes', str(CLASSES), '--input-size', str(SIZE),
                      '--batch-size', '2', '--warmup', '1', '--iters', '5', '--repeats', '1',
                      '--loss-steps', '2', '--threads', '1', '--output-dir', str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / 'benchmark.json') as f:
        report = json.load(f)
    return out, report, proc.stdout


def rows_by(report):
    return {(r['phase'], r['mode']): r for r in report['rows']}


def test_every_mode_of_both_phases_has_a_row(small_run):
    _, report, _ = small_run
    got = {}
    for r in report['rows']:
        got.setdefault(r['phase'], []).append(r['mode'])
    assert got == ALL_MODES


def test_float32_rows_have_positive_throughput_and_memory(small_run):
    _, report, _ = small_run
    for phase in ALL_MODES:
        r = rows_by(report)[(phase, 'float32')]
        assert r['status'] == 'ok'
        assert 0 < r['img_per_s_min'] <= r['img_per_s_median'] <= r['img_per_s_max']
        assert r['timed_iterations'] == 5
        assert r['peak_rss_mib'] > r['rss_after_import_mib'] > 0
        assert r['speedup_vs_float32'] == 1.0 and r['memory_vs_float32'] == 1.0
        assert r['casts'] == {'amp_cast': 0, 'amp_multicast': 0}


def test_contrib_amp_rows_fail_with_the_missing_kernel_error_where_there_are_no_kernels(
        small_run):
    import mxmp
    _, report, stdout = small_run
    available = mxmp.lp_kernels_available('bfloat16')
    assert report['lp_kernels_available'] is available
    for key, r in rows_by(report).items():
        if not key[1].startswith('contrib_amp'):
            continue
        if available:
            assert r['status'] == 'ok'
            continue
        assert r['status'] == 'failed'
        assert 'could not create a primitive descriptor' in r['error']
        assert '\n' not in r['error']
        assert r['img_per_s_median'] is None and r['speedup_vs_float32'] is None
        # contrib.amp's graph was built before the failure: its casts are still counted.
        assert r['casts']['amp_cast'] > 0
        assert 'FAILED: ' + r['error'] in stdout
    # nothing else failed
    assert all(r['status'] == 'ok' for k, r in rows_by(report).items()
               if not k[1].startswith('contrib_amp'))


def test_mxmp_rows_are_emulated_exactly_when_the_probe_finds_no_kernels(small_run):
    import mxmp
    _, report, _ = small_run
    emulated = not mxmp.lp_kernels_available('bfloat16')
    for (phase, mode), r in rows_by(report).items():
        if mode.startswith('mxmp'):
            assert r['emulated'] is emulated
            assert ('(emulated)' in r['label']) is emulated
            assert r['img_per_s_median'] > 0 and r['conversion_s'] > 0
            assert r['speedup_vs_float32'] == pytest.approx(
                r['img_per_s_median'] / rows_by(report)[(phase, 'float32')]['img_per_s_median'])


@pytest.mark.parametrize('cast_params', [False, True])
def test_cast_counts_equal_count_casts_of_the_same_converted_graph(small_run, cast_params):
    import mxnet as mx
    import mxmp
    from gluoncv.model_zoo import get_model
    _, report, _ = small_run
    row = rows_by(report)[('train', 'mxmp_cast_params' if cast_params else 'mxmp')]
    net = get_model(MODEL, pretrained=False, classes=CLASSES)
    net.initialize()
    float32_graph = net(mx.sym.var('data'))
    block = mxmp.convert(net, 'bfloat16', cast_params=cast_params, emulate=row['emulated'])
    assert row['casts'] == mxmp.count_casts(block.mxmp_symbol)
    real = mxmp.count_casts(mxmp.convert_symbol(float32_graph, 'bfloat16',
                                                cast_params=cast_params, emulate=False))
    if row['emulated']:
        assert row['casts_real_graph'] == real
    else:
        assert row['casts'] == real and row['casts_real_graph'] is None
    # The same graph is converted for inference.
    assert rows_by(report)[('infer', row['mode'])]['casts'] == row['casts']


def test_loss_check_reports_float32_and_mxmp_losses_from_the_same_start(small_run):
    _, report, _ = small_run
    loss = report['loss_check']
    assert loss['status'] == 'ok' and loss['steps'] == 2
    for variant in ('float32', 'mxmp', 'mxmp_cast_params'):
        values = loss['losses'][variant]
        assert len(values) == 3 and all(math.isfinite(v) for v in values)
        assert loss[variant]['final'] == values[-1]
    start = loss['losses']['float32'][0]
    # Same initial weights and batch: the first losses differ only by bfloat16 rounding.
    assert loss['losses']['mxmp'][0] == pytest.approx(start, rel=0.05)
    assert loss['float32']['final_rel_diff_vs_float32'] == 0


def test_markdown_table_and_png_are_written(small_run):
    out, report, stdout = small_run
    text = (out / 'benchmark.md').read_text()
    assert text in stdout  # the table is printed too
    assert '| phase | batch | mode | status | img/s median |' in text
    for r in report['rows']:
        assert '| %s | %d | %s |' % (r['phase'], r['batch_size'], r['label']) in text
    if any(r['emulated'] for r in report['rows']):
        assert 'not bfloat16 speed' in text
    png = (out / 'benchmark.png').read_bytes()
    assert png[:8] == b'\x89PNG\r\n\x1a\n' and len(png) > 10000
    assert sorted(os.listdir(out / 'logs'))  # one log per subprocess
    assert report['machine']['env']['OMP_NUM_THREADS'] == '1'


def test_too_few_timed_iterations_are_refused_with_the_fix():
    proc = run_script('--iters', '2', '--output-dir', os.devnull)
    assert proc.returncode == 2
    assert '--iters 5 or more' in proc.stderr


def test_ratios_compare_medians_within_the_same_phase_and_batch():
    bench = load_benchmark()
    rows = [dict(phase='train', batch_size=8, mode='float32', img_per_s_median=10.0,
                 peak_rss_mib=1000.0),
            dict(phase='train', batch_size=8, mode='contrib_amp', img_per_s_median=20.0,
                 peak_rss_mib=500.0),
            dict(phase='train', batch_size=8, mode='mxmp', img_per_s_median=30.0,
                 peak_rss_mib=400.0),
            dict(phase='train', batch_size=16, mode='float32', img_per_s_median=None,
                 peak_rss_mib=None),
            dict(phase='train', batch_size=16, mode='mxmp', img_per_s_median=12.0,
                 peak_rss_mib=300.0)]
    bench.add_ratios(rows)
    assert rows[2]['speedup_vs_float32'] == 3.0 and rows[2]['speedup_vs_contrib_amp'] == 1.5
    assert rows[2]['memory_vs_float32'] == 0.4 and rows[2]['memory_vs_contrib_amp'] == 0.8
    assert rows[4]['speedup_vs_float32'] is None and rows[4]['speedup_vs_contrib_amp'] is None


def test_aggregate_pools_the_iterations_of_every_repeat():
    bench = load_benchmark()
    runs = [{'status': 'ok', 'img_per_s': [1.0, 2.0, 3.0], 'peak_rss_mib': 500.0,
             'rss_after_import_mib': 200.0, 'casts': {'amp_cast': 3, 'amp_multicast': 0},
             'conversion_s': 0.1, 'emulated': False},
            {'status': 'ok', 'img_per_s': [4.0, 5.0], 'peak_rss_mib': 600.0,
             'rss_after_import_mib': 210.0, 'casts': {'amp_cast': 3, 'amp_multicast': 0},
             'conversion_s': 0.3, 'emulated': False}]
    row = bench.aggregate(runs)
    assert (row['img_per_s_median'], row['img_per_s_min'], row['img_per_s_max']) == (3.0, 1.0,
                                                                                     5.0)
    assert row['peak_rss_mib'] == 600.0 and row['timed_iterations'] == 5
    assert row['conversion_s'] == pytest.approx(0.2)
    failed = bench.aggregate([{'status': 'failed', 'error': 'MXNetError: no kernel',
                               'stage': 'warmup', 'casts': None}])
    assert failed['status'] == 'failed' and failed['error'] == 'MXNetError: no kernel'
    assert failed['img_per_s_median'] is None and failed['failed_stage'] == 'warmup'


def test_first_line_drops_mxnet_stack_traces():
    bench = load_benchmark()
    err = RuntimeError('\nTraceback (most recent call last):\n  File "x.cc", line 1\n'
                       'could not create a primitive descriptor iterator\n[bt] (0) libmxnet.so')
    assert bench.first_line(err) == ('RuntimeError: could not create a primitive descriptor '
                                     'iterator')


def test_gpu_context_without_a_gpu_exits_cleanly_with_a_message(tmp_path):
    import mxnet as mx
    if mx.context.num_gpus():
        pytest.skip('a GPU is present: --ctx gpu would measure')
    proc = run_script('--ctx', 'gpu', '--output-dir', str(tmp_path))
    assert proc.returncode == 0
    assert 'sees no CUDA GPU' in proc.stderr and 'nothing measured' in proc.stderr
    assert not (tmp_path / 'benchmark.json').exists()
