"""benchmarks/nmt_loop.py (GluonNLP 0.10's machine-translation training loop, float32 against
mxmp) on the small shape: every mode trains, the converted graphs run their matrix products in
bfloat16 and the reduction rule in the loss, and the first losses agree with float32 (the
first update's loss is computed before any update: bfloat16 rounding only). Behaviour only;
the speed is measured by hand (docs/benchmark.md)."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    pytest.importorskip('gluonnlp')
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, '-m', 'benchmarks.nmt_loop', '--model',
                           'transformer_tiny', '--batch-size', '4', '--seq-len', '12',
                           '--warmup', '1', '--iters', '2'] + list(args),
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_mode_trains_in_its_own_process():
    out = _run('--repeats', '1')
    lines = {l.split()[2]: l for l in out.splitlines() if l.startswith('repeat 0 ')}
    assert sorted(lines) == ['amp', 'convert', 'convert_loss', 'float32'], out
    for mode, line in lines.items():   # the decoder graph's casts: none in float32
        graphs = ast.literal_eval(line[line.index('{'):])
        assert (graphs['casts']['amp_cast'] == 0) == (mode == 'float32'), line
        # the reduction rule's products in the loss: where mxmp converts the loss
        assert (graphs['loss_fc'] > 0) == (mode in ('amp', 'convert_loss')), line
    assert out.count('x float32') == 3


def test_paired_ratio_and_first_loss():
    out = _run('--paired', '--repeats', '1', '--modes', 'convert_loss')
    line = [l for l in out.splitlines() if l.startswith('repeat 0 ')][0]
    losses = ast.literal_eval(line[line.index('losses ') + 7:])   # {mode: 'l0 l1 l2'}
    first = {m: float(v.split()[0]) for m, v in losses.items()}
    assert abs(first['convert_loss'] - first['float32']) <= 0.01 * abs(first['float32'])
    assert 'median of 2 alternating pairs' in out
