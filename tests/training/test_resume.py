"""Bitwise resume: a run checkpointed after N steps and resumed in a new process for M more
steps ends bit-identical to N+M uninterrupted steps (np.testing.assert_array_equal).

Gluon (:class:`mxmp.Trainer`) and Module (:class:`mxmp.Module`), bfloat16 and float16, both
emulated (this CPU has no bfloat16/float16 GEMM) with parameters stored in the target dtype and
float32 master weights. The networks hold BatchNorm (aux states) and Dropout (MXNet's
generator), the optimizers a learning-rate schedule (update counts) and momentum or Adam
moments; the float16 runs use a dynamic loss scaler that grows and skips an overflowed step
before the checkpoint and after the resume. Each run is ``tests/training/resume_worker.py`` in its own
process (its docstring lists what the checkpoint holds and how Dropout stays reproducible).
"""
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = str(Path(__file__).resolve().parent / 'resume_worker.py')
REPO = str(Path(__file__).resolve().parents[2])
STEPS, SAVE_AT = 6, 3


def run_worker(*args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    result = subprocess.run([sys.executable, WORKER] + [str(a) for a in args], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def module_saves_update_counts(ckpt):
    """Whether the Module's optimizer-states file holds the optimizer (its update counts)."""
    with open(os.path.join(ckpt, 'mod-0001.states'), 'rb') as fin:
        states = pickle.loads(fin.read())
    return isinstance(states, tuple) and len(states) == 2


CASES = {
    # api, dtype, extra worker arguments
    'gluon-bfloat16': ('gluon', 'bfloat16', []),
    'gluon-float16-overflow': ('gluon', 'float16', ['--scaler', 'dynamic', '--overflow-at', 2,
                                                    '--overflow-at', 4]),
    'module-bfloat16': ('module', 'bfloat16', []),
    'module-float16-overflow-adam': ('module', 'float16', [
        '--scaler', 'dynamic', '--overflow-at', 2, '--overflow-at', 4,
        '--module-optimizer', 'adam']),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_resumed_run_in_a_new_process_is_bit_identical_to_an_uninterrupted_run(case, tmp_path):
    api, dtype, extra = CASES[case]
    ckpt = tmp_path / 'ckpt'
    common = ['--api', api, '--dtype', dtype, '--steps', STEPS, '--ckpt', ckpt] + extra
    run_worker(*common, '--save-at', SAVE_AT, '--out', tmp_path / 'whole.npz')
    with open(ckpt / 'progress.pkl', 'rb') as fin:
        scale, skipped = pickle.load(fin)['status']
    if '--scaler' in extra:
        # grown after steps 0-1 (interval 2), backed off by the overflow of step 2: the
        # checkpoint holds a scaler that has changed both ways and a skipped step
        assert (scale, skipped) == (2.0 ** 8, 1)
    if api == 'module':
        # the optimizer (update counts: lr schedule, Adam bias correction) is in the states file
        assert module_saves_update_counts(str(ckpt))
    run_worker(*common, '--resume', '--out', tmp_path / 'resumed.npz')
    whole, resumed = np.load(tmp_path / 'whole.npz'), np.load(tmp_path / 'resumed.npz')
    assert sorted(whole.keys()) == sorted(resumed.keys())
    assert any(k.startswith('state:') for k in whole.keys())
    assert len(whole['losses']) == STEPS
    for key in whole.keys():
        np.testing.assert_array_equal(resumed[key], whole[key], err_msg=key)
    if '--scaler' in extra:
        assert int(whole['skipped_steps']) == 2
