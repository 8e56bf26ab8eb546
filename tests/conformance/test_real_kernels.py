"""End to end on oneDNN's real bfloat16 kernels: models converted, trained, against float32.

Marked ``real_kernels``: on a CPU without the kernels (AVX2 only, or ``DNNL_MAX_CPU_ISA=AVX2``)
they skip with the reason (tests/conftest.py). Each model runs in its own process
(tests/conformance/real_kernels_worker.py, which documents the models, sizes and the training), so a kernel
that corrupts memory fails that model alone, with the signal named.

For every model: two copies with the same float32 values; one is run once in float32 (the
migration path), converted with ``mxmp.convert(net, 'bfloat16')`` (no emulation) and both are
trained 3 steps with ``mxmp.Trainer`` (SGD, learning rate 1e-4, momentum 0.9) on the same
batches. Figures are ``max|bfloat16 - float32| / max|float32|``.

Bounds come from seeds 0-3 on a 2-core AMD EPYC with avx512_bf16 (``python
tests/conformance/real_kernels_worker.py MODEL --seed S``), as (measured range) -> bound:

=================  ================  ================  ===============  ===============
model              before training   after 3 steps     train forward    gradients
=================  ================  ================  ===============  ===============
resnet18_v1        0.0051-0.0104     0.0086-0.0193     (0.024-0.054)    (0.36-0.45)
                   -> 4 eps          -> 0.03
mobilenetv2_1.0    0.0082-0.0151     0.032-0.071       (0.16-0.82)      (1.07-1.50)
                   -> 6 eps          -> 0.11
  cast_params      0.0082-0.0151     0.038-0.067       (0.16-0.73)      (1.07-1.57)
                   -> 6 eps          -> 0.11
densenet121 224    0.0035-0.0069     0.0053-0.0108     (0.019-0.052)    (0.80-0.92)
                   -> 3 eps          -> 5 eps
transformer        0.0023-0.0025     0.0022-0.0025     0.0020-0.0029    0.0090-0.0178
                   -> 1 eps          -> 1 eps          -> 1.5 eps       -> 0.03
lstm_lm            0.0032-0.0041     0.0032-0.0041     0.0030-0.0052    0.0025-0.0030
                   -> 1.5 eps        -> 1.5 eps        -> 2 eps         -> 0.005
=================  ================  ================  ===============  ===============

eps = 2**-8 = 0.0039, bfloat16's relative rounding error. With ``transpose`` running in
bfloat16 (MXNet 1.9.1's oneDNN transpose, which also corrupts the heap at these sizes) the
transformer block's error before training was 0.23 (measured), which the bound catches; with
``transpose`` in float32 it is the 0.0023-0.0025 above (emulated: 0.0023 for seed 0).

The three CNNs are trained from Xavier initial values with BatchNorm on batches of 2-4:
a problem so ill-conditioned that float32 itself gives gradients 60% (mobilenetv2_1.0) and 15%
(resnet18_v1) apart when its input is perturbed by 2**-9 relative (measured), so their
gradients and training-mode outputs are reported by the worker but not bounded; their
inference outputs before and after the 3 steps are.
"""
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name('real_kernels_worker.py')

pytestmark = pytest.mark.real_kernels


def run_worker(*args, timeout=600):
    """The worker's JSON figures; a crash fails the test with the signal's name."""
    proc = subprocess.run([sys.executable, str(WORKER)] + list(args), capture_output=True,
                          text=True, timeout=timeout)
    tail = '\n'.join(proc.stderr.strip().splitlines()[-15:])
    if proc.returncode < 0:
        pytest.fail('%s died of %s:\n%s' % (' '.join(args), signal.Signals(-proc.returncode).name,
                                            tail))
    assert proc.returncode == 0, tail
    return json.loads(proc.stdout.strip().splitlines()[-1])


# model, worker arguments, bound before, after, training forward, gradients (None: not bounded)
EPS = 2.0 ** -8
CASES = [
    ('resnet18_v1', [], 4 * EPS, 0.03, None, None),
    ('mobilenetv2_1.0', [], 6 * EPS, 0.11, None, None),
    ('mobilenetv2_1.0', ['--cast-params'], 6 * EPS, 0.11, None, None),
    ('densenet121', [], 3 * EPS, 5 * EPS, None, None),
    ('transformer', [], EPS, EPS, 1.5 * EPS, 0.03),
    ('lstm_lm', [], 1.5 * EPS, 1.5 * EPS, 2 * EPS, 0.005),
]


@pytest.mark.parametrize('model, args, before, after, train, grads', CASES,
                         ids=[c[0] + ''.join(c[1]) for c in CASES])
def test_converted_model_trains_on_real_kernels_and_matches_float32(model, args, before, after,
                                                                   train, grads):
    got = run_worker(model, *args)
    assert np.all(np.isfinite(got['loss_bf16'])) and len(got['loss_bf16']) == 3
    assert 0 < got['rel_err_before'] <= before, got
    assert got['rel_err_after'] <= after, got
    if train is not None:
        assert max(got['rel_err_train']) <= train, got
    if grads is not None:
        assert max(got['grad_rel_err']) <= grads, got
