"""benchmarks.float32_kernels: the "float32 with mxmp's kernels" baseline computes plain
float32's function on mxmp's library ops, with no cast."""
import json

import numpy as np
import pytest

pytest.importorskip('gluonnlp', reason="the BERT models need the optional extra: pip install "
                                       "-e '.[bert]'")

# Relative max-norm error against plain float32 on bert_tiny (batch 4, 16 tokens), measured
# over seeds 0-5 on avx512_bf16 (the library computes float32 alike on every tier): forward
# 1.8e-7 to 1.0e-6, parameter gradients 3.8e-6 to 1.0e-5 (each gradient against its own
# largest value, floored at 1e-6 of the largest gradient: the key biases' gradients are zero in
# exact arithmetic, 1e-12 here). Bounds 10x those.
FORWARD_TOL = 1e-5
GRAD_TOL = 1e-4


def _ops(block, names):
    import mxnet as mx
    counts = {}
    for node in json.loads(block(*[mx.sym.var(n) for n in names]).tojson())['nodes']:
        counts[node['op']] = counts.get(node['op'], 0) + 1
    return counts


def _grads(net, block, xs, out_grad):
    from mxnet import autograd
    params = {k: p for k, p in net.collect_params().items() if p.grad_req != 'null'}
    per = []
    for b in (net, block):
        with autograd.record(train_mode=False):   # Dropout off: a deterministic function
            y = b(*xs)
        y.backward(out_grad)
        per.append({k: p.grad().asnumpy().copy() for k, p in params.items()})
    return per


@pytest.mark.parametrize('seed', [0, 1])
def test_bert_on_library_ops_matches_float32_forward_and_backward(seed):
    import mxnet as mx
    from benchmarks.bert import DATA_NAMES, bert_inputs, build_bert
    from benchmarks.float32_kernels import float32_library_kernels
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    net = build_bert('bert_tiny')
    net.initialize(mx.init.Normal(0.02))
    xs = bert_inputs(mx, 'bert_tiny', 4, 16, mx.cpu(), rng)
    want = net(*xs).asnumpy()
    block = float32_library_kernels(net, DATA_NAMES)
    ops = _ops(block, DATA_NAMES)
    # every LayerNorm (embedding + 2 per layer), softmax with lengths and Dropout is the
    # library's; MXNet's one Dropout left is the rule's training-mode flag; no cast anywhere
    assert ops.get('mxmp_layer_norm') == 5 and ops.get('mxmp_softmax') == 2
    assert ops.get('mxmp_dropout', 0) > 0 and ops.get('Dropout') == 1
    assert 'LayerNorm' not in ops and 'softmax' not in ops
    assert 'amp_cast' not in ops and 'amp_multicast' not in ops
    got = block(*xs)
    assert got.dtype == np.float32
    got = got.asnumpy()
    assert np.abs(got - want).max() <= FORWARD_TOL * np.abs(want).max()
    out_grad = mx.nd.array(np.random.RandomState(seed + 7).normal(size=want.shape))
    ref, lib = _grads(net, block, xs, out_grad)
    top = max(np.abs(g).max() for g in ref.values())
    for name in ref:
        scale = max(np.abs(ref[name]).max(), 1e-6 * top)
        assert np.abs(lib[name] - ref[name]).max() <= GRAD_TOL * scale, name


def test_no_library_is_an_error_not_plain_float32(monkeypatch):
    import mxnet as mx
    from mxmp._src.kernels import build
    from benchmarks.bert import DATA_NAMES, build_bert
    from benchmarks.float32_kernels import float32_library_kernels
    net = build_bert('bert_tiny')
    net.initialize(mx.init.Normal(0.02))
    monkeypatch.setattr(build, 'load_library', lambda *a, **k: None)
    with pytest.raises(RuntimeError, match="operator library does not load"):
        float32_library_kernels(net, DATA_NAMES)


def test_gradient_addto_is_an_error_not_plain_float32(monkeypatch):
    import mxnet as mx
    from benchmarks.bert import DATA_NAMES, build_bert
    from benchmarks.float32_kernels import float32_library_kernels
    net = build_bert('bert_tiny')
    net.initialize(mx.init.Normal(0.02))
    monkeypatch.setenv('MXNET_EXEC_ENABLE_ADDTO', '1')
    with pytest.raises(RuntimeError, match='MXNET_EXEC_ENABLE_ADDTO'):
        float32_library_kernels(net, DATA_NAMES)


def test_kernels_ab_times_mxmp_against_float32_on_library_kernels():
    import subprocess
    import sys
    import pathlib
    repo = pathlib.Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, '-m', 'benchmarks.kernels_ab', '--model', 'bert_tiny', '--batch-size',
         '2', '--seq-len', '16', '--rounds', '3', '--warmup', '1', '--modes',
         'float32_mxmp_kernels,mxmp'], cwd=str(repo), capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result['times_s']) == {'float32', 'float32_mxmp_kernels', 'mxmp'}
    assert all(len(t) == 3 for t in result['times_s'].values())
    # per round: float32_mxmp_kernels' time over mxmp's, the median of the three
    times = result['times_s']
    ratios = sorted(a / b for a, b in zip(times['float32_mxmp_kernels'], times['mxmp']))
    assert result['x_float32_mxmp_kernels'] == pytest.approx(ratios[1])
