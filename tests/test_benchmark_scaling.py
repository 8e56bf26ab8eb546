"""scripts/benchmark.py --threads 1 2 (benchmarks/scaling.py): one full run per thread count in
its own directory, then the ratio against float32 per count and the speed-up from the first
count, of each mode and (--profile) of each operator. Structure and arithmetic only, no timed
assertions: cifar_resnet20_v1 at 32x32, batch 2, training, 1 warm-up + 5 iterations."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / 'scripts' / 'benchmark.py'
TINY = ['--model', 'cifar_resnet20_v1', '--classes', '10', '--input-size', '32',
        '--batch-size', '2', '--warmup', '1', '--iters', '5']


def run_script(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, str(SCRIPT)] + TINY + list(args), cwd=str(REPO),
                          env=env, capture_output=True, text=True, timeout=900)


def test_benchmark_runs_every_mode_at_every_count_and_lines_them_up(tmp_path):
    proc = run_script('--repeats', '1', '--loss-steps', '2', '--gemm-size', '0', '--phases',
                      'train', '--modes', 'float32', 'mxmp', '--threads', '2', '1',
                      '--output-dir', str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    per_count = {}
    for n in (1, 2):
        with open(tmp_path / ('threads%d' % n) / 'benchmark.json') as f:
            per_count[n] = json.load(f)
        # each count ran with its own thread settings
        assert per_count[n]['machine']['threads'] == n
        assert per_count[n]['machine']['env']['OMP_NUM_THREADS'] == str(n)
    # the loss check (numerics) at the first count only
    assert 'loss_check' in per_count[1] and 'loss_check' not in per_count[2]
    with open(tmp_path / 'scaling.json') as f:
        scaling = json.load(f)
    assert scaling['kind'] == 'benchmark' and scaling['threads'] == [1, 2]
    rows = {r['mode']: r for r in scaling['rows']}
    assert sorted(rows) == ['float32', 'mxmp']
    for mode, row in rows.items():
        run = {n: next(r for r in per_count[n]['rows'] if r['mode'] == mode) for n in (1, 2)}
        for n in (1, 2):
            assert row['per_s'][str(n)] == run[n]['img_per_s_median'] > 0
            assert row['vs_float32'][str(n)] == run[n]['speedup_vs_float32']
        assert row['scaling']['2'] == pytest.approx(run[2]['img_per_s_median'] /
                                                    run[1]['img_per_s_median'])
        for n in (1, 2):   # one batch of 2 images, in ms
            assert row['ms'][str(n)] == pytest.approx(2000.0 / run[n]['img_per_s_median'])
    assert rows['float32']['vs_float32'] == {'1': 1.0, '2': 1.0}
    # printed: one line per mode with both counts' figures
    assert '| phase | batch | mode | img/s at 1 | img/s at 2 | ms/batch at 1 | ms/batch at 2 ' \
           '| speed-up 1->2 | x float32 at 1 | x float32 at 2 |' in proc.stdout
    summary = proc.stdout[proc.stdout.index('# Scaling with threads (benchmark): 1, 2'):]
    mxmp_line = next(line for line in summary.splitlines()
                     if line.startswith('| train | 2 | mxmp'))
    assert mxmp_line.endswith('| %.2fx | %.2fx |' % (rows['mxmp']['vs_float32']['1'],
                                                    rows['mxmp']['vs_float32']['2']))
    assert (tmp_path / 'scaling.md').read_text() in proc.stdout


def test_profile_gives_each_operator_its_speed_up(tmp_path):
    proc = run_script('--profile', '--modes', 'float32', '--threads', '1', '2',
                      '--output-dir', str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / 'scaling.json') as f:
        scaling = json.load(f)
    assert scaling['kind'] == 'profile' and scaling['threads'] == [1, 2]
    rows = {r['op']: r for r in scaling['rows']}
    conv = rows['Convolution']
    for n in (1, 2):
        with open(tmp_path / ('threads%d' % n) / 'profile.json') as f:
            report = json.load(f)
        assert report['machine']['threads'] == n
        ms = next(r['ms']['float32'] for r in report['rows'] if r['op'] == 'Convolution')
        assert conv['ms'][str(n)] == ms > 0
    assert conv['speedup']['2'] == pytest.approx(conv['ms']['1'] / conv['ms']['2'])
    assert scaling['rows'][-1]['op'] == 'total'
    assert '| mode | op | ms/iter at 1 | ms/iter at 2 | speed-up 1->2 |' in proc.stdout
    assert '| float32 | Convolution |' in proc.stdout
    # and the projection to more cores, as python -m benchmarks.scaling prints it
    projection = (tmp_path / 'projection.md').read_text()
    assert projection in proc.stdout
    assert "# Projected with Amdahl's law from 1 and 2 threads" in projection
    assert '| mode | ms at 1 (measured) | ms at 2 (measured) | ms at 8 | ms at 16 | ms at 32 ' \
        '| ms at 64 |' in projection
    from benchmarks.scaling import load_profiles, project
    proj = project(load_profiles([str(tmp_path)]), [8, 16, 32, 64])
    conv_proj = next(r for r in proj['modes']['float32']['ops'] if r['op'] == 'Convolution')
    assert conv_proj['ms_a'] == conv['ms']['1'] and conv_proj['ms_b'] == conv['ms']['2']


def test_profile_rows_arithmetic():
    from benchmarks.scaling import markdown, profile_rows
    def report(ms):
        rows = [{'op': op, 'ms': {'float32': v, 'mxmp': v / 2 if v else None}}
                for op, v in ms.items()]
        rows.append({'op': 'total', 'ms': {m: sum(r['ms'][m] or 0 for r in rows)
                                           for m in ('float32', 'mxmp')}})
        return {'modes': {'float32': {}, 'mxmp': {}}, 'rows': rows}
    rows = profile_rows({1: report({'Convolution': 8.0, 'Dropout': 1.0}),
                         4: report({'Convolution': 2.0, 'Dropout': None})})
    got = {(r['mode'], r['op']): r for r in rows}
    assert got[('float32', 'Convolution')]['speedup'] == {1: 1.0, 4: 4.0}
    assert got[('mxmp', 'Convolution')]['ms'] == {1: 4.0, 4: 1.0}
    assert got[('float32', 'Dropout')]['speedup'] == {1: 1.0, 4: None}   # not run at 4
    assert [r['op'] for r in rows if r['mode'] == 'float32'] == ['Convolution', 'Dropout',
                                                                 'total']
    text = markdown('profile', rows, [1, 4], limit=1)
    assert '| float32 | Convolution | 8.00 | 2.00 | 4.00x |' in text
    assert '| float32 | Dropout |' not in text and '| float32 | total | 9.00 | 2.00 | 4.50x |' \
        in text


def test_thread_counts_must_be_distinct_and_positive(tmp_path):
    for bad in (['1', '1'], ['0', '2']):
        proc = run_script('--threads', *bad, '--output-dir', str(tmp_path))
        assert proc.returncode == 2 and 'distinct thread counts >= 1' in proc.stderr


# ------------------------------------------------------------------ Amdahl projection
def _profile(threads, ops, wall_ms, modes=('float32', 'mxmp')):
    """A profile.json report: ops = {op: {mode: ms}}, wall_ms = {mode: ms per iteration}."""
    rows = [{'op': op, 'ms': dict(ms)} for op, ms in ops.items()]
    rows.append({'op': 'total', 'ms': {m: sum(r['ms'].get(m) or 0 for r in rows)
                                       for m in modes}})
    return {'config': {'command': 'python scripts/benchmark.py --profile'},
            'machine': {'threads': threads, 'loadavg_start': [0.5], 'loadavg_end': [0.7]},
            'modes': {m: {'label': m, 'status': 'ok', 'iter_s': [wall_ms[m] / 1000.0]}
                      for m in modes},
            'rows': rows}


def test_serial_fraction_is_amdahls_law_solved_for_s():
    from benchmarks.scaling import amdahl_time, serial_fraction
    # from 1 to 2 threads: s = 2 * t2 / t1 - 1
    assert serial_fraction(10.0, 5.0, 1, 2) == 0.0           # perfect scaling
    assert serial_fraction(10.0, 10.0, 1, 2) == 1.0          # none
    assert serial_fraction(10.0, 7.5, 1, 2) == pytest.approx(0.5)
    assert serial_fraction(10.0, 6.0, 1, 2) == pytest.approx(0.2)
    # clipped: super-linear gives 0, a slow-down 1
    assert serial_fraction(10.0, 4.0, 1, 2) == 0.0
    assert serial_fraction(10.0, 12.0, 1, 2) == 1.0
    # any pair of counts: a time generated with s = 0.3 gives back 0.3
    for n_a, n_b in ((1, 4), (2, 8), (3, 5)):
        t1 = 12.0
        t_a, t_b = t1 * (0.3 + 0.7 / n_a), t1 * (0.3 + 0.7 / n_b)
        assert serial_fraction(t_a, t_b, n_a, n_b) == pytest.approx(0.3)
        assert amdahl_time(t_a, n_a, 0.3, n_b) == pytest.approx(t_b)
        assert amdahl_time(t_a, n_a, 0.3, 64) == pytest.approx(t1 * (0.3 + 0.7 / 64))
    for bad in ((0.0, 1.0, 1, 2), (1.0, 1.0, 2, 2), (1.0, 1.0, 2, 1), (1.0, -1.0, 1, 2)):
        with pytest.raises(ValueError):
            serial_fraction(*bad)


def test_projection_sums_each_operators_amdahl_time():
    from benchmarks.scaling import OUTSIDE, project, projection_markdown
    # float32: a GEMM that scales perfectly (s=0) and an op that does not (s=1), 2 ms outside
    # the operators at both counts (s=1); mxmp: the GEMM twice as fast, same other op.
    r1 = _profile(1, {'FullyConnected': {'float32': 80.0, 'mxmp': 40.0},
                      'Dropout': {'float32': 10.0, 'mxmp': 10.0},
                      'amp_cast': {'mxmp': 6.0}},
                  {'float32': 92.0, 'mxmp': 58.0})
    r2 = _profile(2, {'FullyConnected': {'float32': 40.0, 'mxmp': 20.0},
                      'Dropout': {'float32': 10.0, 'mxmp': 10.0},
                      'amp_cast': {'mxmp': 4.5}, 'only_at_2': {'mxmp': 1.0}},
                  {'float32': 52.0, 'mxmp': 38.0})
    r1['rows'].insert(0, {'op': 'zero_at_1', 'ms': {'mxmp': 0.0}})
    r2['rows'].insert(0, {'op': 'zero_at_1', 'ms': {'mxmp': 0.5}})   # (in the 38.0 ms wall)
    proj = project({2: r2, 1: r1}, [8, 64])
    assert proj['measured'] == [1, 2] and proj['reference'] == 'float32'
    f32, mx = proj['modes']['float32'], proj['modes']['mxmp']
    ops = {r['op']: r for r in f32['ops']}
    assert ops['FullyConnected']['s'] == 0.0 and ops['Dropout']['s'] == 1.0
    assert ops[OUTSIDE]['ms_a'] == pytest.approx(2.0) and ops[OUTSIDE]['s'] == 1.0
    assert f32['ms'][8] == pytest.approx(80 / 8 + 10 + 2)
    assert f32['ms'][64] == pytest.approx(80 / 64 + 10 + 2)
    # amp_cast: 6 -> 4.5 ms, s = 2 * 0.75 - 1 = 0.5
    cast = next(r for r in mx['ops'] if r['op'] == 'amp_cast')
    assert cast['s'] == pytest.approx(0.5)
    assert cast['ms'][8] == pytest.approx(6.0 * (0.5 + 0.5 / 8))
    # timed at one count, or at 0 ms at one: left out, named
    assert mx['unmatched'] == ['only_at_2', 'zero_at_1']
    assert mx['ms'][64] == pytest.approx(40 / 64 + 10 + 2 + 6.0 * (0.5 + 0.5 / 64))
    assert mx['vs_reference'][64] == pytest.approx(f32['ms'][64] / mx['ms'][64])
    assert f32['vs_reference'] == {8: 1.0, 64: 1.0}
    # the measured sums agree with the reports (wall time included through OUTSIDE)
    assert f32['measured_ms'] == {1: pytest.approx(92.0), 2: pytest.approx(52.0)}
    assert mx['measured_ms'] == {1: pytest.approx(58.0), 2: pytest.approx(36.5)}
    # largest projected op first: Dropout (10 ms, serial) leads mxmp at 64 threads
    assert [r['op'] for r in mx['ops']][:2] == ['Dropout', 'amp_cast']
    text = projection_markdown(proj, top=2)
    assert '| float32 | 92.0 | 52.0 | 22.0 | %.1f | 1.00x |' % (80 / 64 + 12) in text
    assert '| Dropout | 10.00 | 10.00 | 1.00x | 1.00 |' in text


def test_projection_command_reads_a_profile_run_directory(tmp_path, capsys):
    from benchmarks.scaling import main
    for n, fc in ((1, 80.0), (2, 40.0)):
        (tmp_path / ('threads%d' % n)).mkdir()
        report = _profile(n, {'FullyConnected': {'float32': fc}}, {'float32': fc},
                          modes=('float32',))
        (tmp_path / ('threads%d' % n) / 'profile.json').write_text(json.dumps(report))
    out = tmp_path / 'proj.json'
    assert main([str(tmp_path), '--project', '8', '16', '--output', str(out)]) == 0
    printed = capsys.readouterr().out
    assert '| float32 | 80.0 | 40.0 | 10.0 | 5.0 | 1.00x | 1.00x | 1.00x | 1.00x |' in printed
    assert json.loads(out.read_text())['modes']['float32']['ms'] == {'8': 10.0, '16': 5.0}
    # bad inputs: a clear error, exit code 2
    assert main([str(tmp_path / 'threads1'), '--project', '8']) == 2
    assert 'at two thread counts' in capsys.readouterr().err
    assert main([str(tmp_path / 'missing'), '--project', '8']) == 2
    assert 'no such file' in capsys.readouterr().err
    assert main([str(tmp_path), '--project', '0']) == 2


def test_benchmark_rows_give_the_latency_of_a_batch_1_call():
    from benchmarks.scaling import benchmark_rows, markdown
    def report(f32, mxmp):
        return {'rows': [{'phase': 'infer', 'batch_size': 1, 'mode': 'float32',
                          'img_per_s_median': f32, 'speedup_vs_float32': 1.0},
                         {'phase': 'infer', 'batch_size': 1, 'mode': 'mxmp',
                          'label': 'mxmp bfloat16', 'img_per_s_median': mxmp,
                          'speedup_vs_float32': mxmp / f32}]}
    rows = benchmark_rows({1: report(10.0, 20.0), 2: report(16.0, 40.0)})
    mx = rows[1]
    assert mx['ms'] == {1: 50.0, 2: 25.0} and mx['scaling'] == {1: 1.0, 2: 2.0}
    assert rows[0]['ms'] == {1: 100.0, 2: 62.5}
    assert '| infer | 1 | mxmp bfloat16 | 20.00 | 40.00 | 50.0 | 25.0 | 2.00x | 2.00x | 2.50x |' \
        in markdown('benchmark', rows, [1, 2])
