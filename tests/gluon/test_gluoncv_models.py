"""GluonCV's detectors trained with the calls GluonCV's training scripts make, in float32, through
``mxmp.convert`` and through ``mxmp.amp.init``; each model and mode in its own process
(tests/gluon/gluoncv_worker.py, which documents the models, inputs and calls).

What is checked, for SSD (VGG-16, 300), YOLO3 (MobileNet), Faster-RCNN (ResNet-50 v1b) and
CenterNet (ResNet-18 v1b), none pretrained:

* ``mxmp.convert`` returns the network itself, hybridized, with its own methods (``set_nms``);
* every Convolution output of the graph MXNet executed for the training call and for the
  validation call (after ``set_nms`` + ``hybridize()``) is bfloat16 -- float32 where this CPU
  has no bfloat16 kernels and the network runs emulated;
* the losses of each step match float32's within the bounds below and are not float32's;
* the validation outputs have float32's shapes and dtypes.

The 12 tests take about 110 s on the 2-core machine (each model's float32 run is shared by its
two mixed-precision tests).

Bounds: ``|loss - loss_float32| / |loss_float32|`` of the total loss, measured for seeds 0-3
(Faster-RCNN 0-2), ``mxmp.convert`` and ``mxmp.amp.init`` (which gave the same losses, bit for
bit: the same graph), on a 2-core AMD EPYC with avx512_bf16 (``python -m tests.gluon.gluoncv_worker
MODEL MODE --seed S`` from the repository root), as measured range -> bound (about twice the
largest value):

=============  ======================  ======================
model          step 0                  steps 1-2
=============  ======================  ======================
ssd            0.0001-0.0015 -> 0.004  0.008-0.075 -> 0.15
yolo3          0.0007-0.0045 -> 0.01   0.03-0.17 -> 0.35
faster_rcnn    0.0012-0.0041 -> 0.01   0.004-0.014 -> 0.03
center_net     0.0022-0.0060 -> 0.015  0.003-0.017 -> 0.04
=============  ======================  ======================

Step 0 compares the same weights on the same batch. The later steps compare two trainings from
there: randomly initialized detectors with losses in the hundreds (YOLO3's objectness loss
starts near 6000) take large first steps, so the paths part. YOLO3's components other than
the objectness loss are not bounded: they sum over the few anchors that match a box and move
by 2-6% in float32 alone when the input is perturbed by 2**-12 relative (measured, seed 2), by
15-25% in bfloat16.
"""
import json
import os
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]

# model -> (bound on the step-0 relative loss difference, bound on steps 1..N-1)
BOUNDS = {
    'ssd': (0.004, 0.15),
    'yolo3': (0.01, 0.35),
    'faster_rcnn': (0.01, 0.03),
    'center_net': (0.015, 0.04),
}
MODELS = ['ssd', 'yolo3', 'faster_rcnn', 'center_net']


@lru_cache(maxsize=None)
def run_worker(model, mode, seed=0):
    """The worker's JSON result; a crash fails the test with the signal's name."""
    pytest.importorskip('gluoncv')
    env = dict(os.environ)
    env.setdefault('OMP_NUM_THREADS', '1')
    proc = subprocess.run([sys.executable, '-m', 'tests.gluon.gluoncv_worker', model, mode,
                           '--seed', str(seed)], cwd=str(ROOT), env=env, capture_output=True,
                          text=True, timeout=1200)
    tail = '\n'.join(proc.stderr.strip().splitlines()[-20:])
    if proc.returncode < 0:
        pytest.fail('%s %s died of %s:\n%s' % (model, mode, signal.Signals(-proc.returncode).name,
                                               tail))
    assert proc.returncode == 0, '%s %s failed:\n%s' % (model, mode, tail)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rel(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.parametrize('model', MODELS)
def test_float32_reference_trains_and_validates(model):
    got = run_worker(model, 'float32')
    assert all(np.isfinite(step['total']) for step in got['losses']), got['losses']
    for graph in (got['train_graph'], got['val_graph']):
        assert graph['total'] > 0 and graph['counts'] == {'float32': graph['total']}, graph
    assert got['val'] and all(v['dtype'] == 'float32' for v in got['val']), got['val']


@pytest.mark.parametrize('mode', ['convert', 'amp'])
@pytest.mark.parametrize('model', MODELS)
def test_mixed_precision_trains_like_float32(model, mode):
    ref = run_worker(model, 'float32')
    got = run_worker(model, mode)
    if mode == 'convert':
        assert got['same_object'] and got['hybridized'] and got['has_set_nms'], got
    assert got['graph_is_mxmp'], 'net._cached_graph is not the graph mxmp converted'
    if mode == 'amp' and model in ('ssd', 'yolo3'):
        # their transforms call the network imperatively: float32, said once
        assert got['imperative_warnings'] == 1, got['imperative_warnings']
    # the same inputs and targets as the float32 run
    assert got['batch_sums'] == ref['batch_sums']

    # the graphs MXNet executed: every Convolution in bfloat16, with casts around them; emulated
    # (no bfloat16 kernels here) in float32, with rounding nodes around them
    want, more = ('bfloat16', 'casts') if got['lp_kernels'] else ('float32', 'nodes')
    for name in ('train_graph', 'val_graph'):
        graph = got[name]
        assert graph['total'] == ref[name]['total'], (name, graph, ref[name])
        assert graph['counts'] == {want: graph['total']}, (name, graph)
        assert graph[more] > ref[name][more], (name, graph, ref[name])

    # losses: bfloat16's, not float32's, and within the bounds
    first, later = BOUNDS[model]
    losses, ref_losses = got['losses'], ref['losses']
    assert len(losses) == len(ref_losses)
    assert all(np.isfinite(step['total']) for step in losses), losses
    assert losses[0] != ref_losses[0], 'identical to float32: the network ran in float32'
    assert rel(losses[0]['total'], ref_losses[0]['total']) <= first, (losses[0], ref_losses[0])
    for i in range(1, len(losses)):
        assert rel(losses[i]['total'], ref_losses[i]['total']) <= later, (i, losses, ref_losses)

    # validation in predict mode: float32's outputs
    assert [(v['shape'], v['dtype']) for v in got['val']] == \
        [(v['shape'], v['dtype']) for v in ref['val']]
