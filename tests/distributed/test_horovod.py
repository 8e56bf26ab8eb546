"""mxmp.horovod.DistributedTrainer under ``horovodrun --gloo -np 2`` on localhost (CPU).

Skipped when ``horovod.mxnet`` cannot be imported: CI does not have Horovod (building it takes
~10 minutes on 2 cores). Build it as docs/distributed.md says (``pip install 'cmake<4' wheel
setuptools``, then ``HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1
HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 pip install --no-build-isolation
horovod==0.28.1``) and run ``python -m pytest tests/distributed/test_horovod.py`` with that Python.

The training jobs run ``tests/distributed/dist_worker.py --kvstore horovod`` (the tiny MLP of
tests/distributed/test_kvstore.py in emulated bfloat16, dynamic loss scaling, an inf on rank 1's loss
at one step); the helpers (single-process reference, comparisons, the process ``tag`` fixture
that fails a test whose processes outlive it) are tests/distributed/test_kvstore.py's. Every job is
bounded: ``horovodrun`` is waited for with a timeout, then SIGTERMed (it stops its workers) and
SIGKILLed with its process group. The whole file takes ~40 s on 2 shared cores (measured).
"""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

hvd = pytest.importorskip(
    'horovod.mxnet',
    reason="horovod.mxnet is not installed: build Horovod with HOROVOD_WITH_MXNET=1 "
           "HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation "
           "horovod==0.28.1 (with 'cmake<4'; see docs/distributed.md)")

from helpers import (DIST_BATCH, INF_RANK, INF_STEP, STEPS, WORKER,  # noqa: E402
                              assert_float32_matches_one_process, assert_identical_workers,
                              assert_matches_one_process, assert_skipped_together, dist_worker,
                              dist_initial_params, reference, relative_error,
                              tagged_pids)

REPO = Path(__file__).resolve().parents[2]
#: Upper bound of one horovodrun job; they take 6-8 s on 2 shared cores (measured).
JOB_TIMEOUT = 240
PARAMS = 10 * 16 + 16 + 16 * 4 + 4   # elements of the MLP's Parameters


def horovodrun_command():
    exe = Path(sys.executable).with_name('horovodrun')
    exe = str(exe) if exe.exists() else shutil.which('horovodrun')
    if exe is None:
        pytest.skip('horovod.mxnet imports but horovodrun is not on PATH')
    return [exe, '--gloo', '-np', '2', '-H', 'localhost:2']


def horovodrun(tag, args, timeout=JOB_TIMEOUT):
    """Run ``horovodrun --gloo -np 2 -H localhost:2 <args>``; return the CompletedProcess."""
    env = dict(os.environ, MXMP_TEST_TAG=tag, OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get('PYTHONPATH')])))
    cmd = horovodrun_command() + list(args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=str(REPO), env=env)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)   # horovodrun stops its workers on SIGTERM
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        for pid in tagged_pids(tag):   # workers in their own sessions
            os.kill(pid, signal.SIGKILL)
        pytest.fail('horovodrun did not return within %d s:\n%s' % (timeout, out))
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def train_job(tag, out_dir, *extra):
    """Train on 2 Horovod workers; return the per-rank npz records (dict rank -> NpzFile)."""
    init = out_dir / 'init.params'
    dist_worker.write_init(str(init))
    result = horovodrun(tag, [sys.executable, str(WORKER), '--kvstore', 'horovod',
                              '--out', str(out_dir), '--init', str(init), '--steps', str(STEPS),
                              '--batch', str(DIST_BATCH), '--inf-step', str(INF_STEP),
                              '--inf-rank', str(INF_RANK), *extra])
    assert result.returncode == 0, result.stdout
    return {r: np.load(out_dir / ('rank%d.npz' % r)) for r in range(2)}


def test_horovodrun_starts_two_gloo_workers_with_ranks_0_and_1(tag):
    result = horovodrun(tag, [sys.executable, '-c',
                              'import horovod.mxnet as hvd; hvd.init(); '
                              'print("rank", hvd.rank(), "of", hvd.size())'], timeout=120)
    assert result.returncode == 0, result.stdout
    assert 'rank 0 of 2' in result.stdout and 'rank 1 of 2' in result.stdout, result.stdout


def test_horovod_bfloat16_workers_start_from_rank_0_skip_together_and_match_one_process(tag,
                                                                                     tmp_path):
    # Rank 1 starts from twice the initial values: matching the reference shows the broadcast.
    records = train_job(tag, tmp_path, '--perturb-other-ranks')
    # Same summed gradients -> same overflow decision, same scale, bit-identical weights.
    assert_identical_workers(records)
    assert_skipped_together(records)   # inf on rank 1 only: both skip, both halve the scale
    assert set(records[0]['exchange_dtypes'].tolist()) == {'float32'}
    assert int(records[0]['bytes_pushed']) == 4 * PARAMS
    # One process on the concatenated batch: the same steps up to bfloat16 rounding of each
    # worker's gradient before the sum (a wrong rescale_grad would double every step: a
    # relative error near 1).
    assert_matches_one_process(records, tmp_path)


def test_horovod_float32_equals_one_process_on_the_concatenated_batch(tag, tmp_path):
    records = train_job(tag, tmp_path, '--dtype', 'float32')
    assert_identical_workers(records)
    assert_skipped_together(records)
    assert_float32_matches_one_process(records, tmp_path)


def test_horovod_bfloat16_parameters_and_float16_sums_match_one_process(tag, tmp_path):
    # cast_params=True: bfloat16 weights and gradients (Horovod has no bfloat16: they are
    # broadcast and summed as float32, or as float16 with grad_dtype='float16').
    records = train_job(tag, tmp_path, '--cast-params', '--perturb-other-ranks',
                        '--grad-dtype', 'float16')
    assert_identical_workers(records)
    assert_skipped_together(records)
    assert set(records[0]['exchange_dtypes'].tolist()) == {'float16'}
    assert int(records[0]['bytes_pushed']) == 2 * PARAMS
    ref = reference(tmp_path, cast_params=True)
    assert ref['applied'] == records[0]['applied'].tolist()
    init = dist_initial_params(tmp_path)
    for step in range(STEPS):
        assert relative_error(records[0], ref, init, step) < 0.02, step


DEFERRED_SCRIPT = r'''
import hashlib
import horovod.mxnet as hvd
import mxnet as mx
from mxnet import autograd, gluon, nd
import mxmp
from mxmp.horovod import DistributedTrainer

hvd.init()
mx.random.seed(100 + hvd.rank())          # every rank draws other initial values
net = gluon.nn.Dense(3)                   # in_units unknown: deferred initialisation
net.initialize(mx.init.Xavier())
trainer = DistributedTrainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                             loss_scaler='dynamic')
for step in range(2):
    x = nd.array([[hvd.rank() + 1.0, 2.0]])
    with autograd.record():
        loss = net(x).sum()
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()
    assert trainer.step(1)
digest = hashlib.sha256(b''.join(p.data().asnumpy().tobytes()
                                 for p in net.collect_params().values())).hexdigest()
print('rank %d params %s' % (hvd.rank(), digest))
for bad in ({'grad_dtype': 'bfloat16'}, {'grad_dtype': 'float16', 'loss_scaler': 'none'}):
    try:
        DistributedTrainer(net.collect_params(), 'sgd', **bad)
    except ValueError as err:
        print('rank %d refused %s: %s' % (hvd.rank(), sorted(bad.items()), err))
two = gluon.nn.Dense(2, in_units=2)
two.initialize(ctx=[mx.cpu(0), mx.cpu(1)])
try:
    DistributedTrainer(two.collect_params(), 'sgd')
except ValueError as err:
    print('rank %d refused two contexts: %s' % (hvd.rank(), err))
'''


def test_horovod_deferred_parameters_are_broadcast_at_the_first_step_and_bad_options_refused(
        tag, tmp_path):
    script = tmp_path / 'deferred.py'
    script.write_text(DEFERRED_SCRIPT)
    result = horovodrun(tag, [sys.executable, str(script)], timeout=120)
    assert result.returncode == 0, result.stdout
    lines = result.stdout.splitlines()
    digests = {line.split('params ')[1] for line in lines if ' params ' in line}
    assert len([line for line in lines if ' params ' in line]) == 2, result.stdout
    assert len(digests) == 1, result.stdout   # both ranks hold the same bytes after 2 steps
    for rank in (0, 1):
        assert "rank %d refused [('grad_dtype', 'bfloat16')]" % rank in result.stdout
        assert 'Type 12' in result.stdout
        assert "rank %d refused [('grad_dtype', 'float16'), ('loss_scaler', 'none')]" % rank \
            in result.stdout
        assert 'dynamic loss scaler' in result.stdout
        assert 'rank %d refused two contexts' % rank in result.stdout
        assert 'one process per device' in result.stdout
