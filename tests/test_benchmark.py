"""scripts/benchmark.py and the benchmarks package behind it: every mode reported, failures as
rows, cast counts, output files, the machine's GEMM peak and each row's percent of it, FLOP
counting, the --profile table.

One small run of the script (cifar_resnet20_v1 at 32x32, batch 2, 1 warm-up + 5 timed
iterations, one thread, 2 loss-check steps, a 256^3 GEMM peak; about 11 subprocesses) is shared
by the tests. No timed assertions: only that the numbers exist and agree with mxmp (and with
hand-computed FLOP) for the same graph.
"""
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
STEM = 'cifarresnetv10_conv0_fwd'  # the stem convolution of MODEL
ALL_MODES = {'train': ['float32', 'contrib_amp', 'mxmp', 'mxmp_cast_params'],
             'infer': ['float32', 'float32_fused', 'contrib_amp', 'contrib_amp_cast_params',
                       'mxmp', 'mxmp_cast_params']}


def run_script(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, str(SCRIPT)] + list(args), cwd=str(REPO), env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='module')
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp('bench')
    proc = run_script('--model', MODEL, '--classes', str(CLASSES), '--input-size', str(SIZE),
                      '--batch-size', '2', '--warmup', '1', '--iters', '5', '--repeats', '1',
                      '--loss-steps', '2', '--threads', '1', '--gemm-size', '256',
                      '--output-dir', str(out))
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
    block(mx.nd.zeros((1, 3, SIZE, SIZE)))
    assert row['casts'] == mxmp.count_casts(mxmp.converted_graph(block))
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
    from benchmarks.stats import add_ratios
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
    add_ratios(rows)
    assert rows[2]['speedup_vs_float32'] == 3.0 and rows[2]['speedup_vs_contrib_amp'] == 1.5
    assert rows[2]['memory_vs_float32'] == 0.4 and rows[2]['memory_vs_contrib_amp'] == 0.8
    assert rows[4]['speedup_vs_float32'] is None and rows[4]['speedup_vs_contrib_amp'] is None


def test_aggregate_pools_the_iterations_of_every_repeat():
    from benchmarks.stats import aggregate
    runs = [{'status': 'ok', 'img_per_s': [1.0, 2.0, 3.0], 'peak_rss_mib': 500.0,
             'rss_after_import_mib': 200.0, 'casts': {'amp_cast': 3, 'amp_multicast': 0},
             'conversion_s': 0.1, 'emulated': False},
            {'status': 'ok', 'img_per_s': [4.0, 5.0], 'peak_rss_mib': 600.0,
             'rss_after_import_mib': 210.0, 'casts': {'amp_cast': 3, 'amp_multicast': 0},
             'conversion_s': 0.3, 'emulated': False}]
    row = aggregate(runs)
    assert (row['img_per_s_median'], row['img_per_s_min'], row['img_per_s_max']) == (3.0, 1.0,
                                                                                     5.0)
    assert row['peak_rss_mib'] == 600.0 and row['timed_iterations'] == 5
    assert row['conversion_s'] == pytest.approx(0.2)
    failed = aggregate([{'status': 'failed', 'error': 'MXNetError: no kernel',
                               'stage': 'warmup', 'casts': None}])
    assert failed['status'] == 'failed' and failed['error'] == 'MXNetError: no kernel'
    assert failed['img_per_s_median'] is None and failed['failed_stage'] == 'warmup'


def test_machine_info_records_glibc_malloc_tunables(monkeypatch):
    # MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ change the bfloat16 BERT step (page faults
    # of oneDNN's per-call scratchpads): a run's JSON must say whether they were set.
    from benchmarks import runner
    monkeypatch.setenv('MALLOC_TRIM_THRESHOLD_', '4294967296')
    monkeypatch.setenv('MALLOC_MMAP_THRESHOLD_', '33554432')
    monkeypatch.setenv('MXMP_MALLOC', 'default')
    monkeypatch.setenv('UNRELATED_VARIABLE', '1')
    env = runner.machine_info(1)['env']
    assert env['MALLOC_TRIM_THRESHOLD_'] == '4294967296'
    assert env['MXMP_MALLOC'] == 'default'   # mxmp's own tuning switched off
    assert env['MALLOC_MMAP_THRESHOLD_'] == '33554432'
    assert env['OMP_NUM_THREADS'] == '1'
    assert 'UNRELATED_VARIABLE' not in env


def test_first_line_drops_mxnet_stack_traces():
    from benchmarks.worker import first_line
    err = RuntimeError('\nTraceback (most recent call last):\n  File "x.cc", line 1\n'
                       'could not create a primitive descriptor iterator\n[bt] (0) libmxnet.so')
    assert first_line(err) == ('RuntimeError: could not create a primitive descriptor '
                                     'iterator')


def test_gpu_context_without_a_gpu_exits_cleanly_with_a_message(tmp_path):
    import mxnet as mx
    if mx.context.num_gpus():
        pytest.skip('a GPU is present: --ctx gpu would measure')
    proc = run_script('--ctx', 'gpu', '--output-dir', str(tmp_path))
    assert proc.returncode == 0
    assert 'sees no CUDA GPU' in proc.stderr and 'nothing measured' in proc.stderr
    assert not (tmp_path / 'benchmark.json').exists()


# ------------------------------------------------------------------------------ the limit
def tiny_flop_net():
    """conv 3->8 k3 stride 2 pad 1; grouped conv 8->8 k3 groups 4 dilation 2 pad 2; dense 10."""
    from mxnet.gluon import nn
    net = nn.HybridSequential(prefix='flop_')
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, strides=2, padding=1, in_channels=3),
                nn.BatchNorm(in_channels=8), nn.Activation('relu'),
                nn.Conv2D(8, 3, padding=2, dilation=2, groups=4, in_channels=8),
                nn.Dense(10, in_units=8 * 8 * 8))
    return net


def test_flop_count_matches_hand_computed_values_for_groups_stride_and_dilation():
    import mxnet as mx
    from benchmarks.flops import forward_flops_per_image, layer_flops
    sym = tiny_flop_net()(mx.sym.var('data'))
    # 16x16 input. conv0: stride 2 -> 8x8x8 outputs, each 3*3*3 = 27 MACs.
    conv0 = 2 * (8 * 8 * 8) * (3 * 3 * 3)
    # conv1: dilation 2 with padding 2 keeps 8x8; 4 groups: each output sees 8/4 = 2 input
    # channels x 3*3 taps = 18 MACs.
    conv1 = 2 * (8 * 8 * 8) * (2 * 3 * 3)
    # dense: 512 inputs (flattened 8x8x8) x 10 outputs.
    dense = 2 * 10 * 512
    assert (conv0, conv1, dense) == (27648, 18432, 10240)
    assert forward_flops_per_image(sym, (3, 16, 16)) == conv0 + conv1 + dense
    layers = layer_flops(sym, {'data': (4, 3, 16, 16)})
    assert [l['op'] for l in layers] == ['Convolution', 'Convolution', 'FullyConnected']
    assert [l['flop'] for l in layers] == [4 * conv0, 4 * conv1, 4 * dense]
    assert layers[1]['weight_shape'] == (8, 2, 3, 3)


def test_flop_count_sees_through_casts_of_a_converted_graph():
    import mxnet as mx
    import mxmp
    from benchmarks.flops import forward_flops_per_image
    sym = tiny_flop_net()(mx.sym.var('data'))
    converted = mxmp.convert_symbol(sym, 'bfloat16')
    assert mxmp.count_casts(converted)['amp_cast'] > 0
    assert forward_flops_per_image(converted, (3, 16, 16)) == \
        forward_flops_per_image(sym, (3, 16, 16))


def test_resnet50_v1_forward_flop_per_image():
    import mxnet as mx
    from gluoncv.model_zoo import get_model
    from benchmarks.flops import forward_flops_per_image
    # 3.86 G multiply-accumulates: GluonCV's resnet50_v1 is ResNet v1 with the stride in the
    # first 1x1 convolution of a bottleneck (4.1 G is v1.5, stride in the 3x3).
    flop = forward_flops_per_image(get_model('resnet50_v1')(mx.sym.var('data')), (3, 224, 224))
    assert flop == 7715946496


def test_percent_of_peak_arithmetic_on_fixed_numbers():
    from benchmarks.peak import percent_of_peak
    # 10 img/s x 8 GFLOP x 3 (training) = 240 GFLOP/s: all of a 240 GFLOP/s peak.
    assert percent_of_peak(10.0, 8e9, 'train', 240.0) == pytest.approx(100.0)
    assert percent_of_peak(10.0, 8e9, 'infer', 240.0) == pytest.approx(100.0 / 3)
    assert percent_of_peak(None, 8e9, 'infer', 240.0) is None
    assert percent_of_peak(10.0, 8e9, 'infer', None) is None


def test_rows_are_compared_with_the_peak_of_their_own_dtype():
    from benchmarks.peak import add_percent_of_peak
    peaks = {'float32': {'status': 'ok', 'gflops_max': 100.0, 'gflops_median': 90.0},
             'bfloat16': {'status': 'ok', 'gflops_max': 200.0, 'gflops_median': 150.0}}
    rows = [dict(phase='infer', mode='float32_fused', img_per_s_median=10.0,
                 flop_per_image=5e9, emulated=False),
            dict(phase='train', mode='mxmp', img_per_s_median=10.0, flop_per_image=5e9,
                 emulated=False),
            dict(phase='train', mode='mxmp', img_per_s_median=10.0, flop_per_image=5e9,
                 emulated=True),
            dict(phase='infer', mode='contrib_amp', img_per_s_median=None, flop_per_image=5e9,
                 emulated=False)]
    add_percent_of_peak(rows, peaks, 'bfloat16')
    assert [r['peak_dtype'] for r in rows] == ['float32', 'bfloat16', 'bfloat16', 'bfloat16']
    assert rows[0]['percent_of_peak'] == pytest.approx(50.0)   # 50 GFLOP/s of 100
    assert rows[1]['percent_of_peak'] == pytest.approx(75.0)   # 150 GFLOP/s of 200
    assert rows[2]['percent_of_peak'] is None  # emulated: float32 kernels, no dtype's speed
    assert rows[3]['percent_of_peak'] is None  # failed row
    unavailable = {'float32': peaks['float32'],
                   'bfloat16': {'status': 'unavailable', 'reason': 'no bfloat16 kernels'}}
    add_percent_of_peak(rows, unavailable, 'bfloat16')
    assert rows[1]['percent_of_peak'] is None and rows[0]['percent_of_peak'] == 50.0


def test_report_has_the_gemm_peaks_and_every_ok_row_a_percent_of_its_peak(small_run):
    import mxmp
    _, report, stdout = small_run
    peaks = report['peaks']
    assert peaks['float32']['status'] == 'ok'
    assert peaks['float32']['gflops_max'] >= peaks['float32']['gflops_median'] > 0
    assert peaks['float32']['calls'] == 5 and peaks['float32']['size'] == 256
    if mxmp.lp_kernels_available('bfloat16'):
        assert peaks['bfloat16']['status'] == 'ok' and peaks['bfloat16']['gflops_median'] > 0
    else:
        assert peaks['bfloat16']['status'] == 'unavailable'
        assert '| bfloat16 | - | - | - | - | unavailable: no bfloat16 kernels' in stdout
    assert '## The limit: GEMM peak of this machine (1 threads' in stdout
    flop = rows_by(report)[('train', 'float32')]['flop_per_image']
    assert flop == 81626368  # cifar_resnet20_v1 at 32x32 (benchmarks.flops)
    for r in report['rows']:
        assert r['flop_per_image'] == flop
        if r['status'] != 'ok' or (r['peak_dtype'] != 'float32' and
                                   peaks['bfloat16']['status'] != 'ok') or r['emulated']:
            assert r['percent_of_peak'] is None
            continue
        factor = 3 if r['phase'] == 'train' else 1
        assert r['percent_of_peak'] == pytest.approx(
            100 * r['img_per_s_median'] * flop * factor / (r['peak_gflops'] * 1e9))
        assert r['peak_gflops'] == peaks[r['peak_dtype']]['gflops_max']  # the fastest call


def test_fused_float32_row_is_the_inference_reference_and_mxmp_fuses_where_kernels_exist(
        small_run):
    import mxmp
    _, report, _ = small_run
    rows = rows_by(report)
    fused = rows[('infer', 'float32_fused')]
    assert fused['status'] == 'ok' and fused['fused'] is True
    assert fused['label'] == 'float32, oneDNN-fused'
    assert fused['speedup_vs_float32_fused'] == 1.0
    assert rows[('infer', 'mxmp')]['speedup_vs_float32_fused'] == pytest.approx(
        rows[('infer', 'mxmp')]['img_per_s_median'] / fused['img_per_s_median'])
    assert rows[('train', 'mxmp')].get('speedup_vs_float32_fused') is None  # inference only
    kernels = mxmp.lp_kernels_available('bfloat16')
    for mode in ('mxmp', 'mxmp_cast_params'):
        assert rows[('infer', mode)]['fused'] is kernels  # fuse_inference='auto'
        assert ('(fused)' in rows[('infer', mode)]['label']) is kernels
        assert rows[('train', mode)]['fused'] is False  # training never fuses


def test_chart_draws_panels_only_for_the_phases_that_ran(small_run, tmp_path):
    from benchmarks.charts import bar_chart
    _, report, _ = small_run
    both = bar_chart(report, str(tmp_path / 'both.png'))  # panel titles, then the figure's
    assert len(both) == 5 and sum('training' in t for t in both[:-1]) == 2
    assert both[-1].startswith('%s, input %dx%d, bfloat16 on cpu' % (MODEL, SIZE, SIZE))
    infer_only = dict(report, rows=[r for r in report['rows'] if r['phase'] == 'infer'])
    titles = bar_chart(infer_only, str(tmp_path / 'infer.png'))[:-1]
    assert len(titles) == 2 and all(t.startswith('inference') for t in titles)


# ------------------------------------------------------------------------------ --profile
def test_profile_mode_prints_operator_times_side_by_side(tmp_path):
    from benchmarks.modes import PROFILE_MODES
    from benchmarks.flops import TRAIN_FACTOR
    from benchmarks.profile import GEMM_LAYER_OPS, parse_aggregate
    proc = run_script('--model', MODEL, '--classes', str(CLASSES), '--input-size', str(SIZE),
                      '--batch-size', '2', '--warmup', '1', '--iters', '5', '--threads', '1',
                      '--profile', '--output-dir', str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / 'profile.json') as f:
        report = json.load(f)
    modes = report['modes']
    assert list(modes) == list(PROFILE_MODES)
    assert modes['float32']['bulk_env'] == {'MXNET_EXEC_BULK_EXEC_TRAIN': '0',
                                            'MXNET_EXEC_BULK_EXEC_INFERENCE': '0'}
    ok = [m for m in modes if modes[m]['status'] == 'ok']
    assert 'float32' in ok and 'mxmp' in ok
    rows = {r['op']: r for r in report['rows']}
    # 21 convolutions per iteration in cifar_resnet20_v1, each mode
    for mode in ok:
        assert rows['Convolution']['calls'][mode] == 21
        assert rows['Convolution']['ms'][mode] > 0 and rows['_backward_Convolution']['ms'][mode]
    conv = rows['Convolution']
    assert conv['ratio']['mxmp'] == pytest.approx(conv['ms']['float32'] / conv['ms']['mxmp'])
    assert rows['total']['ms']['float32'] == pytest.approx(sum(
        r['ms']['float32'] or 0 for op, r in rows.items() if op != 'total'))
    # The table parsed from MXNet's own dump, kept beside it
    text = (tmp_path / 'profile_train_bs2_float32.txt').read_text()
    parsed = parse_aggregate(text)['operator']['Convolution']
    assert parsed['count'] == 5 * 21
    assert parsed['total_ms'] / 5 == pytest.approx(conv['ms']['float32'])
    assert '| Convolution |' in proc.stdout and 'float32 / mxmp bfloat16' in proc.stdout
    # the split between the counted layers and the rest, from the same rows and the graph's FLOP
    split = modes['mxmp']['gemm_layer_split']
    gemm = sum(rows[op]['ms']['mxmp'] or 0 for op in GEMM_LAYER_OPS if op in rows)
    assert split['gemm_ms'] == pytest.approx(gemm)
    assert split['gemm_ms'] + split['other_ms'] == pytest.approx(rows['total']['ms']['mxmp'])
    flop = modes['mxmp']['flop_per_image'] * 2 * TRAIN_FACTOR
    assert split['gemm_gflops'] == pytest.approx(flop / gemm / 1e6)
    assert 'convolutions and fully-connected layers' in proc.stdout


def test_gemm_layer_split_divides_the_operator_time():
    from benchmarks.profile import gemm_layer_split
    per_iter = {'Convolution': (600.0, 53), '_backward_Convolution': (1250.0, 53),
                'FullyConnected': (1.0, 1), '_backward_FullyConnected': (3.0, 1),
                'BatchNorm': (50.0, 53), 'sgd_mom_update': (36.0, 193)}
    split = gemm_layer_split(per_iter, 7.716e9, 16, 3)
    assert split['gemm_ms'] == 1854.0 and split['other_ms'] == 86.0
    assert split['gemm_gflops'] == pytest.approx(7.716e9 * 48 / 1.854 / 1e9)
    assert split['all_gflops'] == pytest.approx(7.716e9 * 48 / 1.940 / 1e9)
    assert gemm_layer_split({'BatchNorm': (1.0, 1)}, 7.7e9, 16, 3) is None
    assert gemm_layer_split(per_iter, None, 16, 3) is None


def test_profile_parser_reads_sections_and_refuses_other_text():
    from benchmarks.profile import parse_aggregate, per_iteration
    text = ('Profile Statistics:\n\tNote the difference in units for different entries.\n'
            'operator\n=================\n'
            'Name                          Total Count        Time (ms)    Min Time (ms)    '
            'Max Time (ms)    Avg Time (ms)\n'
            '----                          -----------        ---------    -------------    '
            '-------------    -------------\n'
            '_backward_Convolution                  42          18.4610           0.0560     '
            '      4.1900           0.4395\n'
            'Convolution                            42          11.3120           0.0280     '
            '      6.7550           0.2693\n')
    ops = parse_aggregate(text)['operator']
    assert ops['Convolution'] == {'count': 42, 'total_ms': 11.312, 'min_ms': 0.028,
                                  'max_ms': 6.755, 'avg_ms': 0.2693}
    assert per_iteration({'operator': ops}, 2)['_backward_Convolution'] == (9.2305, 21.0)
    with pytest.raises(ValueError, match='aggregate_stats'):
        parse_aggregate('nothing here')
    storage = ('Device Storage\n=================\nName                          Total Count    '
               'Min Use  (kB)    Max Use  (kB)    Avg Use  (kB)\n----                          '
               '-----------    -------------    -------------    -------------\n'
               'Memory: cpu/0                           2          40.0000          80.0000     '
               '     20.0000\n')
    assert parse_aggregate(storage)['Device Storage']['Memory: cpu/0'] == {
        'count': 2, 'total_ms': None, 'min_ms': 40.0, 'max_ms': 80.0, 'avg_ms': 20.0}


def test_memory_split_into_fixed_and_per_image_parts():
    from benchmarks.memory import memory_markdown, memory_split
    # ResNet-50 training peak RSS measured at batch 16 and 32 (docs/benchmark.md, "Memory")
    rows = [dict(mode=m, phase='train', batch_size=b, peak_rss_mib=v, status='ok')
            for m, b, v in (('float32', 16, 2196.0), ('float32', 32, 3831.0),
                            ('mxmp', 16, 1467.0), ('mxmp', 32, 2226.0),
                            ('contrib_amp', 16, 1500.0))]
    rows.append(dict(mode='mxmp', phase='infer', batch_size=8, peak_rss_mib=900.0, status='ok'))
    split = memory_split(rows)
    assert list(split) == ['float32', 'mxmp']  # contrib_amp: one batch size only
    assert split['float32']['per_image_mib'] == pytest.approx((3831 - 2196) / 16)
    assert split['float32']['fixed_mib'] == pytest.approx(2196 - 16 * (3831 - 2196) / 16)
    assert split['mxmp']['per_image_mib'] == pytest.approx(47.4375)
    text = '\n'.join(memory_markdown(split, {'float32': 'float32', 'mxmp': 'mxmp bfloat16'}))
    assert '| mxmp bfloat16 | 16, 32 | 1467, 2226 | 47.4 | 708 | 0.46x | +147 |' in text
    assert memory_split(rows[:1]) == {} and memory_markdown({}, {}) == []


def test_train_rss_prints_peak_memory_step_time_and_losses():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-m', 'benchmarks.train_rss', '--model', MODEL,
                           '--classes', str(CLASSES), '--input-size', str(SIZE),
                           '--batch-size', '2', '--steps', '3', '--fp32-ops', 'BatchNorm',
                           '--excluded-names', STEM, '--pad-channels', '4'],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith('%s batch 2 pad_channels 4 cast_params False fp32_ops BatchNorm '
                           'excluded_names %s: peak RSS ' % (MODEL, STEM))
    assert 'img/s (median of 1 steps)' in line
    losses = [float(v) for v in line.split('losses ')[1].split(', ')]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)


def test_dnnl_verbose_log_is_summed_per_step_phase_and_primitive(tmp_path):
    """A DNNL_VERBOSE=1 log of train_rss --mark-phases, summed by benchmarks.dnnl_verbose: the
    phases of every step, convolutions in the backward pass, and the exact sums of a made-up log."""
    from benchmarks.dnnl_verbose import summarize
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1', DNNL_VERBOSE='1', MXNET_EXEC_BULK_EXEC_TRAIN='0')
    proc = subprocess.run([sys.executable, '-m', 'benchmarks.train_rss', '--model', MODEL,
                           '--classes', str(CLASSES), '--input-size', str(SIZE),
                           '--batch-size', '2', '--steps', '2', '--mark-phases'],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    phases = summarize(proc.stdout.splitlines())
    assert sorted(phases) == [(s, ph) for s in (0, 1) for ph in ('backward', 'forward', 'update')]
    backward = phases[(1, 'backward')]
    conv = {k: v for k, v in backward.items() if k[0] == 'convolution'}
    assert conv and all(k[3] == '' for k in conv)  # one row per kernel and direction
    assert {k[2] for k in conv} >= {'backward_weights'}
    assert sum(calls for calls, _ in conv.values()) >= 21  # cifar_resnet20_v1's 21 convs
    made_up = ['dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 '
               'dst_bf16::blocked:abcd:f0,,,2x8x4x4,0.5',
               'dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 '
               'dst_bf16::blocked:abcd:f0,,,2x8x4x4,0.25',
               'onednn_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:'
               'abcd:f0,,alg:convolution_direct,mb2_ic8oc8_ih4oh4kh3sh1dh0ph1,2.0',
               'dnnl_verbose,create:cache_miss,cpu,reorder,jit:uni,undef,x,,,2x8,9.0',
               '== step 0 forward']
    (got,) = summarize(made_up).values()
    assert got == {('reorder', 'jit:uni', 'undef',
                    'src_f32::blocked:abcd:f0 dst_bf16::blocked:abcd:f0'): [2, 0.75],
                   ('convolution', 'jit:avx2', 'forward_training', ''): [1, 2.0]}


def test_train_rss_float32_reference_and_allocation_peak(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    before = set(os.listdir(REPO))
    lines = {}
    for variant in ([], ['--float32']):
        proc = subprocess.run([sys.executable, '-m', 'benchmarks.train_rss', '--model', MODEL,
                               '--classes', str(CLASSES), '--input-size', str(SIZE),
                               '--batch-size', '8', '--steps', '3', '--allocated'] + variant,
                              cwd=str(tmp_path), env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lines[bool(variant)] = proc.stdout.strip().splitlines()[-1]
    # the profiler's trace file is written to a temporary file and removed, nowhere else
    assert os.listdir(tmp_path) == [] and set(os.listdir(REPO)) == before
    assert lines[True].startswith('%s batch 8 float32 (no mxmp): peak RSS ' % MODEL)
    assert lines[False].startswith('%s batch 8 cast_params False' % MODEL)
    allocated = {k: float(v.split("MXNet's allocations peak ")[1].split(' MiB')[0])
                 for k, v in lines.items()}
    # the weights, gradients, momenta and activations of a training step: more than nothing,
    # less than the process
    for k, line in lines.items():
        rss = float(line.split('peak RSS ')[1].split(' MiB')[0])
        assert 0 < allocated[k] < rss
    losses = {k: [float(v) for v in line.split('losses ')[1].split(', ')]
              for k, line in lines.items()}
    assert losses[True][0] == pytest.approx(losses[False][0], rel=0.05)  # the same model


def test_train_rss_refuses_an_excluded_name_that_is_not_in_the_graph():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-m', 'benchmarks.train_rss', '--model', MODEL,
                           '--classes', str(CLASSES), '--input-size', str(SIZE),
                           '--batch-size', '2', '--steps', '3', '--excluded-names', 'conv0_fwd'],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2  # argparse's usage error, before any step runs
    assert 'no node named conv0_fwd in the graph of %s' % MODEL in proc.stderr


def test_train_rss_pad_channels_trains_the_same_model():
    # --pad-channels 4 must be the 3-channel model (zero channel, zero weight column): the first
    # loss differs only by the convolutions' accumulation order. Measured |relative difference|
    # over batch sizes 2, 4, 8: 1.6e-4 to 6.4e-4 with real bfloat16 kernels, 0 emulated.
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    first = []
    for extra in ([], ['--pad-channels', '4']):
        proc = subprocess.run([sys.executable, '-m', 'benchmarks.train_rss', '--model', MODEL,
                               '--classes', str(CLASSES), '--input-size', str(SIZE),
                               '--batch-size', '2', '--steps', '1'] + extra,
                              cwd=str(REPO), env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        first.append(float(proc.stdout.strip().splitlines()[-1].split('losses ')[1]))
    assert abs(first[1] - first[0]) <= 0.005 * abs(first[0]), first


# ------------------------------------------------------------------------------ BERT
# bert_tiny (benchmarks.bert): 2 layers, 64 units, 4 heads, feed-forward 256, 16 tokens.
BERT_MODES = {'train': ['float32', 'float32_mxmp_kernels', 'contrib_amp',
                        'contrib_amp_fp32_attention', 'mxmp'],
              'infer': ['float32', 'float32_mxmp_kernels', 'float32_fused', 'contrib_amp',
                        'contrib_amp_fp32_attention', 'mxmp']}
# FLOP of one 16-token sequence of bert_tiny, by hand (2 per multiply-accumulate): per layer
# the query/key/value projection 16*64*192, the output projection 16*64*64, the feed-forward
# 2*16*64*256, the two attention products 4 heads * 16*16*16 each; then the pooler 64*64 and
# the 2-class classifier 64*2.
BERT_TINY_FLOP = 2 * (2 * (16 * 64 * 192 + 16 * 64 * 64 + 2 * 16 * 64 * 256 + 2 * 4 * 16 ** 3)
                      + 64 * 64 + 64 * 2)


@pytest.fixture(scope='module')
def bert_run(tmp_path_factory):
    pytest.importorskip('gluonnlp', reason='the BERT models need the optional extra: '
                                           "pip install -e '.[bert]'")
    out = tmp_path_factory.mktemp('bert')
    proc = run_script('--model', 'bert_tiny', '--seq-len', '16', '--batch-size', '2',
                      '--warmup', '1', '--iters', '5', '--repeats', '1', '--loss-steps', '1',
                      '--threads', '1', '--gemm-size', '256', '--output-dir', str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / 'benchmark.json') as f:
        report = json.load(f)
    return report, proc.stdout


def test_bert_runs_every_mode_of_both_phases_with_sequences_as_the_unit(bert_run):
    report, stdout = bert_run
    got = {}
    for r in report['rows']:
        got.setdefault(r['phase'], []).append(r['mode'])
    assert got == BERT_MODES
    assert report['config']['unit'] == 'seq' and report['config']['seq_len'] == 16
    assert '| phase | batch | mode | status | seq/s median |' in stdout
    assert '# mxmp benchmark: bert_tiny, sequence length 16' in stdout
    for r in report['rows']:
        assert r['flop_per_image'] == BERT_TINY_FLOP
        assert '| %s | 2 | %s |' % (r['phase'], r['label']) in stdout
    for phase in BERT_MODES:
        assert rows_by(report)[(phase, 'float32')]['status'] == 'ok'


def test_bert_contrib_amp_failure_on_gluonnlp_attention_is_a_row_not_a_crash(bert_run):
    import mxmp
    report, stdout = bert_run
    rows = rows_by(report)
    for phase in BERT_MODES:
        r = rows[(phase, 'contrib_amp')]
        # Type inference refuses the graph before any kernel runs: the same on every CPU.
        assert r['status'] == 'failed'
        assert 'interleaved_matmul_selfatt_valatt' in r['error']
        assert 'expected bfloat16, got float32' in r['error']
        assert r['img_per_s_median'] is None and '\n' not in r['error']
        assert 'FAILED: ' + r['error'] in stdout
        workaround = rows[(phase, 'contrib_amp_fp32_attention')]
        if mxmp.lp_kernels_available('bfloat16'):
            assert workaround['status'] == 'ok' and workaround['img_per_s_median'] > 0
            # where contrib.amp as is failed, the workaround is the contrib.amp reference
            assert rows[(phase, 'mxmp')]['contrib_amp_reference'] == \
                'contrib_amp_fp32_attention'
            assert rows[(phase, 'mxmp')]['speedup_vs_contrib_amp'] == pytest.approx(
                rows[(phase, 'mxmp')]['img_per_s_median'] / workaround['img_per_s_median'])
            assert workaround['layer_dtypes']['FullyConnected'] == {'bfloat16': 10}
            assert workaround['layer_dtypes']['_contrib_interleaved_matmul_selfatt_valatt'] \
                == {'float32': 2}
        else:
            assert workaround['status'] == 'failed'


def test_bert_float32_with_mxmp_kernels_is_a_float32_row_on_library_ops(bert_run):
    report, stdout = bert_run
    rows = rows_by(report)
    assert "x float32 mxmp's kernels" in stdout
    for phase in BERT_MODES:
        r = rows[(phase, 'float32_mxmp_kernels')]
        assert r['status'] == 'ok' and r['img_per_s_median'] > 0
        assert "| %s | 2 | float32, mxmp's kernels |" % phase in stdout
        # the library's LayerNorm (5), softmax with lengths (2) and Dropout run; no cast
        assert r['library_ops']['mxmp_layer_norm'] == 5
        assert r['library_ops']['mxmp_softmax'] == 2 and r['library_ops']['mxmp_dropout'] > 0
        assert r['casts'] == {'amp_cast': 0, 'amp_multicast': 0}
        assert r['layer_dtypes']['FullyConnected'] == {'float32': 10}
        mxmp_row = rows[(phase, 'mxmp')]
        assert mxmp_row['speedup_vs_float32_mxmp_kernels'] == pytest.approx(
            mxmp_row['img_per_s_median'] / r['img_per_s_median'])


def test_bert_mxmp_runs_its_fully_connected_layers_in_bfloat16(bert_run):
    report, stdout = bert_run
    for phase in BERT_MODES:
        r = rows_by(report)[(phase, 'mxmp')]
        assert r['status'] == 'ok' and r['img_per_s_median'] > 0
        assert r['casts']['amp_cast'] > 0
        # 2 layers x 4 (query/key/value, output projection, 2 feed-forward) + pooler + classifier
        fc = r['layer_dtypes']['FullyConnected']
        if r['emulated']:  # float32 kernels with bfloat16 rounding: the real graph has casts
            assert fc == {'float32': 10} and r['casts_real_graph']['amp_cast'] > 0
        else:
            assert fc == {'bfloat16': 10}
            assert r['percent_of_peak'] > 0 and r['peak_dtype'] == 'bfloat16'
        # the attention products: mxmp's bfloat16 library op where its GEMM runs (the
        # avx512_bf16 tier), else MXNet's op in float32
        from mxmp._src.graph.kernel_rule import attention_pays
        if not r['emulated'] and attention_pays():
            assert r['layer_dtypes']['mxmp_selfatt_qk'] == {'bfloat16': 2}
            assert '_contrib_interleaved_matmul_selfatt_qk' not in r['layer_dtypes']
        else:
            assert r['layer_dtypes']['_contrib_interleaved_matmul_selfatt_qk'] == {'float32': 2}
        assert rows_by(report)[(phase, 'float32')]['layer_dtypes']['FullyConnected'] == \
            {'float32': 10}
    assert '- train mxmp bfloat16' in stdout and 'FullyConnected: 10 ' in stdout
    loss = report['loss_check']
    assert loss['status'] == 'ok' and loss['steps'] == 1
    # dropout off and the same weights: the first losses differ only by bfloat16 rounding
    assert loss['losses']['mxmp'][0] == pytest.approx(loss['losses']['float32'][0], rel=0.05)


def test_bert_without_gluonnlp_names_the_extra_to_install(monkeypatch):
    from benchmarks.bert import require_gluonnlp
    from benchmarks.modes import BenchmarkError
    monkeypatch.setitem(sys.modules, 'gluonnlp', None)  # import gluonnlp raises ImportError
    monkeypatch.setitem(sys.modules, 'gluonnlp.model', None)
    with pytest.raises(BenchmarkError, match=r"pip install -e '\.\[bert\]'"):
        require_gluonnlp()


def test_flop_count_of_attention_matmuls_and_sequence_inputs():
    import mxnet as mx
    from benchmarks.flops import forward_flops_per_image, layer_flops
    length, units, heads = 8, 12, 3
    x = mx.sym.var('tokens')  # (batch, length, units)
    qkv = mx.sym.FullyConnected(mx.sym.transpose(x, axes=(1, 0, 2)), num_hidden=3 * units,
                                flatten=False, name='qkv')  # (length, batch, 3 units)
    scores = mx.sym.contrib.interleaved_matmul_selfatt_qk(qkv, heads=heads, name='qk')
    att = mx.sym.softmax(scores, axis=-1)
    ctx = mx.sym.contrib.interleaved_matmul_selfatt_valatt(qkv, att, heads=heads, name='valatt')
    b = mx.sym.var('other')  # (batch, length, 5)
    out = mx.sym.batch_dot(mx.sym.transpose(ctx, axes=(1, 0, 2)), b, transpose_a=True,
                           name='bd')  # (batch, units, 5), K = length
    layers = {l['name']: l for l in layer_flops(out, {'tokens': (2, length, units),
                                                      'other': (2, length, 5)})}
    assert layers['qkv']['flop'] == 2 * 2 * length * units * 3 * units
    assert layers['qk']['flop'] == 2 * (2 * heads * length * length) * (units // heads)
    assert layers['valatt']['flop'] == 2 * (length * 2 * units) * length
    assert layers['bd']['flop'] == 2 * (2 * units * 5) * length
    assert layers['qk']['weight_shape'] is None
    per_sample = forward_flops_per_image(out, {'tokens': (length, units), 'other': (length, 5)})
    assert per_sample == sum(l['flop'] for l in layers.values()) // 2
    # the kernel rule's library pair (mxmp_selfatt_qk with a second output, emit_v): the same
    from mxmp._src.graph.kernel_rule import apply_kernels
    from mxmp._src.graph.symbol_json import dump, load
    lib = apply_kernels(load(out), 'auto', attention=True)
    if any(n.get('attrs', {}).get('emit_v') == '1' for n in lib['nodes']):   # library loads
        paired = layer_flops(dump(lib), {'tokens': (2, length, units), 'other': (2, length, 5)})
        assert {l['name']: l['flop'] for l in paired} == {k: l['flop'] for k, l in layers.items()}


def test_contrib_amp_reference_falls_back_to_the_workaround_row_only_where_needed():
    from benchmarks.stats import add_ratios
    rows = [dict(phase='infer', batch_size=8, mode='float32', img_per_s_median=10.0,
                 peak_rss_mib=1000.0),
            dict(phase='infer', batch_size=8, mode='contrib_amp', img_per_s_median=None,
                 peak_rss_mib=None),
            dict(phase='infer', batch_size=8, mode='contrib_amp_fp32_attention',
                 img_per_s_median=12.0, peak_rss_mib=900.0),
            dict(phase='infer', batch_size=8, mode='mxmp', img_per_s_median=15.0,
                 peak_rss_mib=800.0),
            dict(phase='train', batch_size=8, mode='contrib_amp', img_per_s_median=5.0,
                 peak_rss_mib=900.0),
            dict(phase='train', batch_size=8, mode='contrib_amp_fp32_attention',
                 img_per_s_median=4.0, peak_rss_mib=900.0),
            dict(phase='train', batch_size=8, mode='mxmp', img_per_s_median=10.0,
                 peak_rss_mib=800.0)]
    add_ratios(rows)
    assert rows[3]['contrib_amp_reference'] == 'contrib_amp_fp32_attention'
    assert rows[3]['speedup_vs_contrib_amp'] == 1.25
    assert rows[6]['contrib_amp_reference'] == 'contrib_amp'  # contrib.amp as is ran
    assert rows[6]['speedup_vs_contrib_amp'] == 2.0
