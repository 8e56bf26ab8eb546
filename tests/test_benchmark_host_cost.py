"""benchmarks.host_cost: the facts docs/benchmark.md's host-side section rests on (MXNet 1.9.1's
multi-precision update ops refuse bfloat16 weights and take float16 ones) and a smoke run of
its Trainer-only timing on a small network."""
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in [os.environ.get('PYTHONPATH')] if p]), OMP_NUM_THREADS='1')
    out = subprocess.run([sys.executable, '-m', 'benchmarks.host_cost', *args], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_no_multi_precision_update_op_of_mxnet_takes_a_bfloat16_weight():
    lines = [l for l in _run('--fused-routes').splitlines() if l.strip()]
    bf16 = [l for l in lines if '(bfloat16 weight)' in l]
    fp16 = [l for l in lines if '(float16 weight)' in l]
    assert len(bf16) == len(fp16) == 6
    assert all('MXNetError' in l for l in bf16), bf16
    assert all(l.rstrip().endswith(' ok') for l in fp16), fp16


def test_update_only_times_the_trainer_step_of_a_small_network():
    res = json.loads(_run('--model', 'cifar_resnet20_v1', '--input-size', '32', '--classes',
                          '10', '--batch-size', '2', '--mode', 'mxmp', '--update-only',
                          '--iters', '2', '--warmup', '1').splitlines()[-1])
    assert res['weights'] > 0 and res['values'] > 0
    assert 0 < res['update_host_cpu_ms'] and 0 < res['update_host_ms'] <= res['update_total_ms']
