"""An encoder-decoder Transformer on MXNet's interleaved attention operators (the ops
contrib.amp 1.9.1 fails on in bfloat16: "expected bfloat16, got float32"), trained with bucketed
batches and GluonNLP's clip flow through ``mxmp.convert`` and ``mxmp.amp``, checkpointed
mid-run and resumed in a new process (tests/amp/encdec_worker.py; Sockeye's own command:
tests/amp/test_sockeye.py).

Measured over seeds 0-2 (Zen 5, real bfloat16 kernels), the largest relative difference of the
12 per-step losses from float32's: bfloat16 5.0e-4..7.0e-4 (convert and amp alike), float16
(emulated) 2.1e-4..6.2e-4.
"""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mxmp

pytest.importorskip('gluonnlp')
ROOT = Path(__file__).resolve().parents[2]
BOUND = 4e-3


@functools.lru_cache(maxsize=None)
def worker(mode, *args):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-m', 'tests.amp.encdec_worker', mode, *args],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('mode', ['convert-bfloat16', 'convert-float16', 'amp-bfloat16'])
def test_bucketed_training_follows_float32(mode):
    dtype = mode.split('-')[1]
    ref, got = worker('float32'), worker(mode)
    assert {s['length'] for s in got['steps']} == {6, 10, 14}
    for ours, theirs in zip(got['steps'], ref['steps']):
        assert not ours['skipped']
        assert abs(ours['loss'] / theirs['loss'] - 1) < BOUND
    assert [s['loss'] for s in got['steps']] != [s['loss'] for s in ref['steps']]
    real = dtype == 'bfloat16' and mxmp.lp_kernels_available('bfloat16')
    assert got['fc_dtypes'] == {'bfloat16' if real else 'float32': 12}
    assert set(got['rounding']) == {dtype}


@pytest.mark.parametrize('mode', ['convert-float16', 'amp-bfloat16'])
def test_checkpoint_mid_run_and_resume_bit_for_bit(tmp_path, mode):
    whole = worker(mode)
    first = worker(mode, '--save-at', '5', '--dir', str(tmp_path))
    rest = worker(mode, '--resume', str(tmp_path))
    assert first['steps'] + rest['steps'] == whole['steps']
    assert rest['weights'] == whole['weights']
