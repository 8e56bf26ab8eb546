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
    assert rows['float32']['vs_float32'] == {'1': 1.0, '2': 1.0}
    # printed: one line per mode with both counts' figures
    assert '| phase | batch | mode | img/s at 1 | img/s at 2 | speed-up 1->2 | x float32 at 1 ' \
           '| x float32 at 2 |' in proc.stdout
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
