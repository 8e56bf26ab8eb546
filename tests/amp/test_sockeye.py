"""Sockeye 2.3's own training command (``python -m sockeye.train ... --amp``), an
encoder-decoder transformer with bucketed batches, run with ``mxnet.contrib.amp`` swapped for
``mxmp.amp`` (tests/amp/sockeye_launcher.py) through two checkpoints, then resumed from its own
training state for a third. scripts/test.sh installs Sockeye with ``--no-deps`` (it pins
mxnet==1.8.0.post0); without it these tests skip.

Measured spread (this file's settings, 12 updates, seeds 1-3, Zen 5 with real bfloat16 kernels):
validation perplexity relative to float32 at checkpoints 1-3, bfloat16 -0.014..+0.033%;
float16 (emulated, ``--amp-scale-interval 3``, so every third scale overflows and its update is
skipped) -0.003..+0.002% at checkpoints 1-2 and +0.9..+1.4% at checkpoint 3 (after skipped
updates).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mxmp

pytest.importorskip('sockeye')
ROOT = Path(__file__).resolve().parents[2]
SEED = 2


def corpus(path, n, seed):
    import random
    rng = random.Random(seed)
    words = ['w%d' % i for i in range(50)]
    src, trg = [], []
    for _ in range(n):
        sent = [rng.choice(words) for _ in range(rng.randint(3, 12))]
        src.append(' '.join(sent))
        trg.append(' '.join(reversed(sent)))
    path.with_suffix('.src').write_text('\n'.join(src) + '\n')
    path.with_suffix('.trg').write_text('\n'.join(trg) + '\n')


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp('sockeye')
    corpus(d / 'train', 400, 0)
    corpus(d / 'dev', 40, 1)
    return d


def train(data, out, updates, dtype=None, extra=()):
    args = ['-s', 'train.src', '-t', 'train.trg', '-vs', 'dev.src', '-vt', 'dev.trg',
            '--use-cpu', '--num-layers', '1', '--transformer-model-size', '32',
            '--transformer-feed-forward-num-hidden', '64', '--transformer-attention-heads', '2',
            '--num-embed', '32', '--batch-size', '64', '--batch-type', 'sentence',
            '--checkpoint-interval', '4', '--decode-and-evaluate', '0', '--max-seq-len', '16',
            '--transformer-dropout-attention', '0', '--transformer-dropout-act', '0',
            '--transformer-dropout-prepost', '0', '--seed', str(SEED), '-o', out,
            '--max-updates', str(updates), *extra]
    cmd = [sys.executable, '-m', 'sockeye.train'] if dtype is None else \
        [sys.executable, '-m', 'tests.amp.sockeye_launcher', dtype, '--amp']
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run(cmd + args, cwd=str(data), env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val = [float(field.split('=')[1]) for line in (data / out / 'metrics').read_text().splitlines()
           for field in line.split('\t') if field.startswith('perplexity-val=')]
    return val, (json.loads(proc.stdout.strip().splitlines()[-1]) if dtype else None), proc.stderr


@pytest.fixture(scope='module')
def float32(data):
    return train(data, 'f32', 12)[0]


def resumed(data, name, dtype, extra=()):
    first, _, _ = train(data, name, 8, dtype, extra)           # checkpoints 1 and 2
    assert len(first) == 2
    with open(data / name / 'training_state' / 'amp_loss_scaler.pkl', 'rb') as fp:
        import pickle
        saved = pickle.load(fp)
    val, info, log = train(data, name, 12, dtype, extra)      # resumes, checkpoint 3
    assert 'Resuming from saved state' in log
    assert val[:2] == first and len(val) == 3
    return val, info, saved


def test_bfloat16_trains_through_checkpoints_and_resumes(data, float32):
    val, info, saved = resumed(data, 'bf16', 'bfloat16')
    assert saved == [1.0, 1.0, 0]            # scaling off for bfloat16: contrib.amp's fields
    assert info['fields'][3] == 2000         # Sockeye's --amp-scale-interval, kept
    for ours, ref in zip(val, float32):
        assert abs(ours / ref - 1) < 2e-3    # measured: 3.3e-4 at most
    assert val != float32
    if mxmp.lp_kernels_available('bfloat16'):
        assert set(info['fc_dtypes']) == {'bfloat16'}
    else:                                    # emulated: float32 kernels, bfloat16 rounding
        assert set(info['fc_dtypes']) == {'float32'}
    # Sockeye's attention (self and source: the encoder-decoder interleaved matmuls) runs on
    # mxmp's bfloat16 library ops where their GEMM runs, MXNet's float32 ops elsewhere
    from mxmp._src.graph.kernel_rule import attention_pays
    if attention_pays():
        assert set(info['attention_ops']) == {'mxmp_encdec_qk', 'mxmp_encdec_valatt'}, info
    else:
        assert set(info['attention_ops']) == {'_contrib_interleaved_matmul_encdec_qk',
                                              '_contrib_interleaved_matmul_encdec_valatt'}, info


def test_float16_resume_continues_the_loss_scale_schedule(data, float32):
    extra = ('--amp-scale-interval', '3')
    whole, info_whole, _ = train(data, 'f16_whole', 12, 'float16', extra)
    val, info, saved = resumed(data, 'f16', 'float16', extra)
    # Sockeye's own resume is not bit for bit (float32, this setup: checkpoint 3 moved 6.3e-5
    # relative), and whether a scale of 2**19 overflows float16 depends on the last bits, so
    # the schedules are compared where they must agree: the resumed process starts from the
    # saved fields (a fresh scaler would start at 2**16 with no steps counted).
    assert info['first_step'] == saved and info_whole['first_step'] == [2.0 ** 16] * 2 + [0]
    assert val[:2] == whole[:2] and abs(val[2] / whole[2] - 1) < 1e-3
    loss_scale, next_scale, unskipped = saved
    assert loss_scale == next_scale and loss_scale > 2.0 ** 16 and 0 <= unskipped < 3
    assert info['fields'][3] == 3
    assert set(info['fc_dtypes']) == {'float32'}       # float16 is emulated on a CPU
    for ours, ref in zip(val[:2], float32[:2]):
        assert abs(ours / ref - 1) < 2e-3
    assert abs(val[2] / float32[2] - 1) < 0.04        # skipped updates: measured 1.4% at most
    assert val != float32
