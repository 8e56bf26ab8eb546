"""Multi-process training over MXNet's dist_sync kvstore, and scripts/launch_local.py.

CPU and loopback only. Every job runs under ``scripts/launch_local.py`` (scheduler, servers and
workers on 127.0.0.1) with a ``--timeout``, and the launcher itself is waited for with a timeout
(then killed with its process group); every process of a job carries a unique
``MXMP_TEST_TAG`` in its environment, and the ``tag`` fixture fails the test if one survives the
job (after killing it). The whole file takes 70-110 s on 2 shared cores.

The training jobs run ``tests/distributed/dist_worker.py``: a tiny MLP, converted with
``mxmp.convert(net, 'bfloat16', emulate=True)`` (this CPU has no bfloat16 oneDNN kernels), trained
by ``mxmp.Trainer`` (``trainer.step(global batch)``) or ``mxmp.Module`` with dynamic loss
scaling, 2 workers + 1 server. The single-process reference runs the same code in this process
on the concatenated batch. The tests of the gradient exchange (``grad_dtype``, bfloat16
Parameters over ``dist_sync``) skip on an mxmp.Trainer without ``exchange_dtype``.
"""
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

import mxmp
from helpers import DIST_BATCH, INF_RANK, INF_STEP, REPO, STEPS, WORKER, assert_float32_matches_one_process, assert_identical_workers, assert_matches_one_process, assert_skipped_together, dist_initial_params, dist_worker, reference, relative_error  # noqa: E402

LAUNCHER = REPO / 'scripts' / 'launch_local.py'
#: Upper bound of one training job (the launcher's --timeout); they take ~10 s on 2 cores.
JOB_TIMEOUT = 120


def launch(tag, worker_args, num_workers=2, num_servers=1, timeout=JOB_TIMEOUT,
           launcher_args=(), server_command=None):
    """Run ``launch_local.py ... -- <worker_args>``; return the CompletedProcess (text output)."""
    cmd = [sys.executable, str(LAUNCHER), '-n', str(num_workers), '-s', str(num_servers),
           '--timeout', str(timeout), '--env', 'MXMP_TEST_TAG=%s' % tag,
           '--env', 'OMP_NUM_THREADS=1', *launcher_args]
    if server_command:
        cmd += ['--server-command', server_command]
    cmd += ['--', *worker_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=str(REPO))
    try:
        out, _ = proc.communicate(timeout=timeout + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail('the launcher itself did not return within %d s:\n%s' % (timeout + 30, out))
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def train_job(tag, out_dir, *extra, num_workers=2):
    """Launch the training workers; return the per-rank npz records (dict rank -> NpzFile)."""
    init = out_dir / 'init.params'
    if not init.exists():
        dist_worker.write_init(str(init))
    result = launch(tag, [sys.executable, str(WORKER), '--out', str(out_dir), '--init',
                          str(init), '--steps', str(STEPS), '--batch', str(DIST_BATCH),
                          '--inf-step', str(INF_STEP), '--inf-rank', str(INF_RANK), *extra],
                    num_workers=num_workers)
    assert result.returncode == 0, result.stdout
    # The optimizer runs on the workers, never on the kvstore, and the wrappers say so.
    assert result.stdout.count('update_on_kvstore=False') == num_workers, result.stdout
    return {r: np.load(out_dir / ('rank%d.npz' % r)) for r in range(num_workers)}


def test_dist_sync_bfloat16_workers_stay_identical_skip_together_and_match_one_process(
        tag, tmp_path):
    records = train_job(tag, tmp_path)
    # Same reduced gradients -> same overflow decision, same scale, bit-identical weights.
    assert_identical_workers(records)
    assert_skipped_together(records)
    # One process on the concatenated batch takes the same steps. The difference comes from
    # bfloat16 rounding of each worker's gradient before the sum (measured: 0.2-0.4 % of the
    # distance travelled); a wrong rescale_grad (step(batch) instead of step(global batch))
    # would double every step, a relative error near 1.
    assert_matches_one_process(records, tmp_path)


def test_dist_sync_float32_equals_one_process_on_the_concatenated_batch(tag, tmp_path):
    records = train_job(tag, tmp_path, '--dtype', 'float32')
    assert_identical_workers(records)
    assert_skipped_together(records)
    assert_float32_matches_one_process(records, tmp_path)


#: The gradient exchange of issue 6 (mxmp.Trainer grad_dtype, bfloat16 over dist_*).
HAS_EXCHANGE = hasattr(mxmp.Trainer, 'exchange_dtype')
needs_exchange = pytest.mark.skipif(not HAS_EXCHANGE,
                                    reason='mxmp.Trainer without grad_dtype/exchange_dtype')
PARAMS = 10 * 16 + 16 + 16 * 4 + 4   # elements of the MLP's Parameters


@needs_exchange
def test_dist_sync_bfloat16_parameters_travel_as_float32_and_match_one_process(tag, tmp_path):
    # cast_params=True: bfloat16 weights and gradients, float32 master weights. MXNet's
    # parameter server aborts on bfloat16 ("Unknown type enum 12"), so mxmp exchanges them
    # as float32.
    # Rank 1 starts from other values: matching the reference shows that every worker starts
    # from rank 0's (the bfloat16 weights are broadcast through float32 as well).
    records = train_job(tag, tmp_path, '--cast-params', '--perturb-other-ranks')
    assert_identical_workers(records)
    assert_skipped_together(records)
    assert set(records[0]['exchange_dtypes'].tolist()) == {'float32'}
    assert int(records[0]['bytes_pushed']) == 4 * PARAMS
    ref = reference(tmp_path, cast_params=True)
    assert ref['applied'] == records[0]['applied'].tolist()
    init = dist_initial_params(tmp_path)
    for step in range(STEPS):
        assert relative_error(records[0], ref, init, step) < 0.02, step


@needs_exchange
def test_dist_sync_float16_gradient_exchange_halves_the_bytes_and_matches_one_process(
        tag, tmp_path):
    records = train_job(tag, tmp_path, '--grad-dtype', 'float16')
    assert_identical_workers(records)
    assert_skipped_together(records)
    assert set(records[0]['exchange_dtypes'].tolist()) == {'float16'}
    assert int(records[0]['bytes_pushed']) == 2 * PARAMS
    ref = reference(tmp_path)
    init = dist_initial_params(tmp_path)
    for step in range(STEPS):
        assert relative_error(records[0], ref, init, step) < 0.02, step


@needs_exchange
def test_float16_exchange_on_a_local_kvstore_matches_the_float32_exchange():
    # Two CPU contexts, the 'device' kvstore, no launcher: the same two steps with float32 and
    # float16 gradient exchange; float16 rounding of the reduced gradients only.
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    x, y = dist_worker.global_batch(0, 16, seed=3)
    results = {}
    for grad_dtype in ('float32', 'float16', 'bfloat16'):
        mx.random.seed(0)
        net = dist_worker.make_net()
        net.initialize(mx.init.Xavier(), ctx=[mx.cpu(0), mx.cpu(1)])
        trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                               kvstore='device', grad_dtype=grad_dtype,
                               loss_scaler=mxmp.DynamicLossScaler(init_scale=2.0 ** 10))
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for _ in range(2):
            with autograd.record():
                losses = [loss_fn(net(nd.array(x[i * 8:(i + 1) * 8], ctx=mx.cpu(i))),
                                  nd.array(y[i * 8:(i + 1) * 8], ctx=mx.cpu(i)))
                          for i in range(2)]
                with trainer.scale_loss(losses) as scaled:
                    autograd.backward(scaled)
            assert trainer.step(16)
        results[grad_dtype] = ({n: p.data(mx.cpu(1)).asnumpy()
                                for n, p in net.collect_params().items()},
                               trainer.bytes_pushed_per_step())
    (p32, bytes32), (p16, bytes16) = results['float32'], results['float16']
    pb16, bytesb16 = results['bfloat16']
    assert bytes16 * 2 == bytesb16 * 2 == bytes32 == 4 * PARAMS
    for name in p32:
        assert not np.array_equal(p16[name], p32[name])   # rounded: the exchange really ran
        np.testing.assert_allclose(p16[name], p32[name], rtol=1e-2, atol=1e-3)
        np.testing.assert_allclose(pb16[name], p32[name], rtol=3e-2, atol=3e-3)


@needs_exchange
def test_grad_dtype_is_validated():
    net = dist_worker.make_net()
    net.initialize()
    with pytest.raises(ValueError, match='dynamic loss scaler'):
        mxmp.Trainer(net.collect_params(), 'sgd', grad_dtype='float16', loss_scaler='none')
    with pytest.raises(ValueError, match='grad_dtype must be'):
        mxmp.Trainer(net.collect_params(), 'sgd', grad_dtype='int8')
    # MXNet's parameter server aborts on bfloat16: refused before any kvstore is created.
    with pytest.raises(ValueError, match='Unknown type enum 12'):
        mxmp.Trainer(net.collect_params(), 'sgd', kvstore='dist_sync', grad_dtype='bfloat16')
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', kvstore=None)
    assert trainer.num_workers == 1 and trainer.bytes_pushed_per_step() == 0
    assert trainer.exchange_dtype('mlp_fc1_weight') == 'float32'


def test_trainer_turns_update_on_kvstore_off_with_a_log_line_or_refuses_it(caplog):
    import mxnet as mx
    net = dist_worker.make_net()
    net.initialize(ctx=[mx.cpu(0), mx.cpu(1)])
    with pytest.raises(ValueError, match='update_on_kvstore=True'):
        mxmp.Trainer(net.collect_params(), 'sgd', kvstore='device', update_on_kvstore=True)
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', kvstore='device')
    with caplog.at_level('INFO', logger='mxmp.trainer'):
        assert trainer.num_workers == 1   # creates the kvstore
    assert "update_on_kvstore=False on the 'device' kvstore" in caplog.text
    assert trainer._update_on_kvstore is False


def test_dist_sync_module_bfloat16_workers_stay_identical_and_match_one_process(tag, tmp_path):
    # Rank 1 starts from other values: init_optimizer must give it rank 0's.
    records = train_job(tag, tmp_path, '--api', 'module', '--perturb-other-ranks')
    assert_identical_workers(records)
    assert_skipped_together(records)
    ref = reference(tmp_path, api='module')
    assert ref['applied'] == records[0]['applied'].tolist()
    init = dist_initial_params(tmp_path, api='module')
    for step in range(STEPS):
        assert relative_error(records[0], ref, init, step) < 0.02, step


# ---------------------------------------------------------------------------- the launcher
def sleeper(tmp_path, body):
    """Write a small Python script with ``body``; return its path as a string."""
    path = tmp_path / ('proc_%s.py' % uuid.uuid4().hex[:8])
    path.write_text('import os, signal, subprocess, sys, time\n' + body)
    return str(path)


def test_launcher_kills_a_hanging_job_at_the_timeout_with_exit_code_124(tag, tmp_path):
    hang = sleeper(tmp_path, "print('up', flush=True)\ntime.sleep(600)\n")
    result = launch(tag, [sys.executable, hang], timeout=3,
                    server_command='%s %s' % (sys.executable, hang))
    assert result.returncode == 124, result.stdout
    assert 'timeout' in result.stdout
    for name in ('scheduler', 'server 0', 'worker 0', 'worker 1'):
        assert '[%s] up' % name in result.stdout


def test_launcher_sigkills_processes_that_ignore_sigterm_and_their_children(tag, tmp_path):
    stubborn = sleeper(tmp_path, (
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"))
    result = launch(tag, [sys.executable, stubborn], timeout=3,
                    launcher_args=['--kill-after', '1'],
                    server_command='%s %s' % (sys.executable, stubborn))
    assert result.returncode == 124, result.stdout
    assert 'ignored SIGTERM' in result.stdout
    # the tag fixture checks that the grandchildren are gone too


def test_launcher_stops_everything_when_one_worker_fails_and_returns_its_code(tag, tmp_path):
    # A real dist_sync job: the rank-0 worker dies (exit 3) once the kvstore is up; the other
    # worker then waits forever in kv.barrier() and the server for pushes.
    result = launch(tag, [sys.executable, str(WORKER), '--out', str(tmp_path), '--init',
                          'unused', '--fail-rank', '0'], timeout=JOB_TIMEOUT,
                    launcher_args=['--kill-after', '1'])
    assert result.returncode == 3, result.stdout
    assert 'failed with exit code 3' in result.stdout
    assert 'rank 0 fails on purpose' in result.stdout


def test_launcher_returns_the_first_failing_workers_code_when_the_others_succeed(
        tag, tmp_path):
    ok = sleeper(tmp_path, "sys.exit(0 if os.environ['MXMP_LAUNCH_INDEX'] == '0' else 7)\n")
    serve = sleeper(tmp_path, "time.sleep(600)\n")
    result = launch(tag, [sys.executable, ok], timeout=60,
                    server_command='%s %s' % (sys.executable, serve))
    assert result.returncode == 7, result.stdout
    assert 'worker 1 (pid' in result.stdout


def test_launcher_stops_the_job_on_ctrl_c(tag, tmp_path):
    hang = sleeper(tmp_path, "print('up', flush=True)\ntime.sleep(600)\n")
    cmd = [sys.executable, str(LAUNCHER), '-n', '2', '--timeout', '60', '--env',
           'MXMP_TEST_TAG=%s' % tag, '--server-command', '%s %s' % (sys.executable, hang),
           '--', sys.executable, hang]
    # SIGINT at its default in the launcher even when this suite runs as a background job,
    # which inherits it ignored (as would the launcher, which then rightly keeps running).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] and None,
                     daemon=True).start()
    seen = []
    try:
        deadline = time.monotonic() + 30
        while sum(l.endswith('] up\n') for l in seen) < 4:   # all four processes run
            seen.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(0.2)   # let the reader thread drain the pipe
    while not lines.empty():
        seen.append(lines.get())
    out = ''.join(seen)
    assert proc.returncode == 130, out
    assert 'interrupted' in out


def test_launcher_environment_is_loopback_only_and_names_every_role(tag, tmp_path):
    show = sleeper(tmp_path, (
        "keys = ('DMLC_ROLE', 'DMLC_PS_ROOT_URI', 'DMLC_NODE_HOST', 'DMLC_NUM_SERVER', "
        "'DMLC_NUM_WORKER', 'MXMP_LAUNCH_INDEX')\n"
        "print(' '.join(os.environ[k] for k in keys), flush=True)\n"))
    result = launch(tag, [sys.executable, show], num_workers=2, num_servers=2, timeout=60,
                    server_command='%s %s' % (sys.executable, show))
    assert result.returncode == 0, result.stdout
    for prefix, role, index in (('scheduler', 'scheduler', 0), ('server 0', 'server', 0),
                                ('server 1', 'server', 1), ('worker 0', 'worker', 0),
                                ('worker 1', 'worker', 1)):
        assert '[%s] %s 127.0.0.1 127.0.0.1 2 2 %d\n' % (prefix, role, index) in result.stdout
