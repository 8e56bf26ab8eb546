"""mxmp's library Dropout inside real training steps (tests/kernels/dropout_step_worker.py): a
small GPT of benchmarks/gpt.py, hybridized with static_alloc and static_shape, 3 SGD steps.

Checked: the loss and every gradient equal those of the same graph with each Dropout written
out as x * mask / (1 - p), fed the masks the library's forward returned (so the forward
applied them and the backward used the same ones: measured over seeds 1-5 and 7, loss below
2.7e-7 relative, gradients below 7e-6, inference output below 1.1e-6 (the library LayerNorm's
rounding); bounds about 10x); a mask changes between steps and between layers (a fraction
2 p (1 - p) of the elements differ, as for independent masks); the dropped fraction is p; a
seed gives the same masks in float32 and in bfloat16 (``convert_symbol(..., kernels='all')``),
so the transformer study's float32 and bfloat16 runs with the library are paired
(docs/accuracy.md). Where oneDNN has no bfloat16 kernels (an AVX2 CPU, DNNL_MAX_CPU_ISA=AVX2) the
bfloat16 run is emulated (``emulate=True``), with the same library Dropout.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mxmp
from mxmp._src.kernels.build import load_library

HERE = os.path.dirname(os.path.abspath(__file__))
P = 0.3


@pytest.fixture(scope='module')
def steps():
    if load_library() is None:
        pytest.skip("mxmp's operator library does not build here (no C++ compiler?)")
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'dropout_step_worker.py'), '7'],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_training_step_uses_one_mask_in_forward_and_backward(steps):
    # every Dropout of the model (embedding, attention weights, two residual branches per
    # block) became mxmp_dropout and returned its mask
    assert steps['n_masks'] == steps['n_dropout'] == 7
    assert max(steps['loss_err']) <= 3e-6, steps['loss_err']
    assert max(steps['grad_err']) <= 5e-5, steps['grad_err']
    assert steps['inference_err'] <= 1e-5


def test_masks_are_fresh_per_step_and_per_layer(steps):
    # every call saw the training flag (an inference call keeps everything)
    assert min(min(d) for d in steps['dropped']) > 0.15, steps['dropped']
    n = sum(steps['mask_sizes']) * len(steps['dropped'])
    assert abs(np.mean(steps['dropped']) - P) <= 5 * (P * (1 - P) / n) ** 0.5
    differ = 2 * P * (1 - P)
    for key in ('step_differs', 'layer_differs'):
        values = steps[key]
        assert min(values) > 0.25, (key, values)          # never the same mask (0)
        bound = 5 * (differ * (1 - differ) / (steps['mask_sizes'][0] * len(values))) ** 0.5
        assert abs(np.mean(values) - differ) <= bound, (key, np.mean(values))


def test_float32_and_bfloat16_runs_of_a_seed_draw_the_same_masks(steps):
    # every Dropout of the bfloat16 graph is the library's, emulated or not
    assert steps['bf16_mxmp_dropout'] == 7
    assert steps['bf16_emulated'] == (not mxmp.lp_kernels_available('bfloat16'))
    assert len(steps['bf16_masks_equal']) == 21 and all(steps['bf16_masks_equal'])
    # the losses differ by bfloat16's rounding only (measured below 0.2%)
    assert 0 < max(steps['bf16_loss_rel']) <= 0.01
