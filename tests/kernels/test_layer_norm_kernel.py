"""mxmp's operator library (mxmp/_src/kernels) and the pass's kernel rule (LayerNorm).

The kernel runs in worker processes (tests/kernels/kernels_worker.py: a kernel under test
could crash the interpreter), on the machine's real kernels and with oneDNN capped to AVX2
(``DNNL_MAX_CPU_ISA=AVX2``, the emulated path of the rest of mxmp). Bounds come from the spread
measured over seeds 0-2 on the Zen 5 machine: float64 errors below 2e-13, float32 below 8e-7
(relative to the largest reference value); the bounds are 5x those.
"""
import json
import os
import subprocess
import sys

import pytest

import mxnet as mx
import mxmp
from mxmp._src.graph.kernel_rule import INPUT_COPY
from mxmp._src.graph.symbol_json import MARK
from mxmp._src.kernels.build import load_library
from tier_run import needs_library

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = load_library() is not None
BOUND = {'float64': 1e-12, 'float32': 4e-6}


def _worker(what, **env):
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'kernels_worker.py'), what],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS='1', **env))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module', params=['native', 'AVX2'])
def kernel_results(request):
    return _worker('kernel', **({'DNNL_MAX_CPU_ISA': 'AVX2'} if request.param == 'AVX2' else {}))


def _graph(**ln_attrs):
    data = mx.sym.var('data')
    h = mx.sym.FullyConnected(data, num_hidden=16, flatten=False, name='fc')
    ln = mx.sym.LayerNorm(h, name='ln', **ln_attrs)
    ln = ln[0] if len(ln.list_outputs()) > 1 else ln
    return mx.sym.FullyConnected(ln, num_hidden=4, flatten=False, name='fc2')


def _ops(sym):
    return [n['op'] for n in json.loads(sym.tojson(remove_amp_cast=False))['nodes']
            if n['op'] != 'null']


@needs_library
def test_forward_and_backward_match_mxnet_layer_norm(kernel_results):
    rows = kernel_results['rows']
    assert len(rows) == 2 * 7 * 3
    for row in rows:
        out, dx, dgamma, dbeta = row['errors']
        assert row['dtype_out'] == "<class 'numpy.%s'>" % row['dtype']
        if row['shape'][-1] == 1:   # one value per row: out = beta, dx = 0 exactly
            assert out <= BOUND[row['dtype']] and dgamma == 0.0, row
            continue
        assert max(row['errors']) <= BOUND[row['dtype']], row


@needs_library
def test_rows_with_a_large_mean_keep_float32_accuracy(kernel_results):
    # rows with mean 3000 and spread 3: the one-pass statistics are shifted by the row's first
    # value, so the library's float32 result is as close to float64 as MXNet's, or closer
    for seed in kernel_results['offset']:
        assert max(seed['lib']) <= 1e-4
        for lib, ref in zip(seed['lib'][:3], seed['mxnet'][:3]):
            assert lib <= ref


@needs_library
def test_rule_substitutes_layer_norm_and_explain_names_it():
    conv = mxmp.convert_symbol(_graph(eps=1e-12), 'bfloat16')
    nodes = json.loads(conv.tojson(remove_amp_cast=False))['nodes']
    ln = [n for n in nodes if n['op'] == 'mxmp_layer_norm']
    assert len(ln) == 1 and ln[0]['name'] == 'ln' and ln[0]['attrs']['eps'] == '1e-12'
    # gamma and beta: MXNet's identity shaped like data's last axis (MXNet's wrapper of library
    # ops infers data's shape alone), also the copy whose backward honours grad_req='add'
    copies = [n for n in nodes if n['op'] == '_identity_with_attr_like_rhs']
    assert sorted(nodes[n['inputs'][0][0]]['name'] for n in copies) == ['ln_beta', 'ln_gamma']
    assert all(n['attrs'][MARK] == INPUT_COPY for n in copies)
    def tie(n):   # the arange over data's last axis, cast to gamma's float32 where data is low
        src = nodes[n['inputs'][1][0]]
        return nodes[src['inputs'][0][0]] if src['op'] == 'amp_cast' else src
    assert all(tie(n)['op'] == '_contrib_arange_like' for n in copies)
    assert ln[0]['attrs']['__ext_extra_inputs__'] == '2'
    assert [nodes[s]['name'] for s, _, _ in ln[0]['inputs'][1:]] == [c['name'] for c in copies]
    assert 'LayerNorm' not in _ops(conv)
    rows = {r.name: r for r in mxmp.explain(_graph(), 'bfloat16')}
    # the library op takes the bfloat16 output of the FullyConnected before it as it comes
    assert rows['ln'].op == 'mxmp_layer_norm' and rows['ln'].dtype == 'bfloat16'
    assert rows['ln'].rule.startswith('kernel rule: LayerNorm as mxmp_layer_norm')
    assert "kernels='mxnet'" in rows['ln'].rule


@needs_library
def test_rule_is_undone_by_remove_casts_and_idempotent():
    sym = _graph()
    conv = mxmp.convert_symbol(sym, 'bfloat16')
    assert mxmp.remove_casts(conv).tojson() == sym.tojson()
    again = mxmp.convert_symbol(conv, 'bfloat16')
    assert again.tojson(remove_amp_cast=False) == conv.tojson(remove_amp_cast=False)


def test_rule_off_keeps_mxnet_layer_norm(monkeypatch):
    assert 'mxmp_layer_norm' not in _ops(mxmp.convert_symbol(
        _graph(), policy=mxmp.Policy('bfloat16', kernels='mxnet')))
    # float16 graphs run on GPUs: the library has CPU kernels only
    assert 'mxmp_layer_norm' not in _ops(mxmp.convert_symbol(_graph(), 'float16'))
    # the library cannot add to a gradient in place (MXNet passes it no request)
    monkeypatch.setenv('MXNET_EXEC_ENABLE_ADDTO', '1')
    assert 'LayerNorm' in _ops(mxmp.convert_symbol(_graph(), 'bfloat16'))


@pytest.mark.parametrize('attrs', [dict(axis=1), dict(output_mean_var=True)])
def test_rule_leaves_other_layer_norms(attrs):
    assert 'LayerNorm' in _ops(mxmp.convert_symbol(_graph(**attrs), 'bfloat16'))


def test_policy_rejects_unknown_kernels_value():
    with pytest.raises(ValueError, match="kernels='fast'.*'auto'.*'mxnet'"):
        mxmp.Policy(kernels='fast')


@needs_library
def test_grad_req_add_and_null_through_the_rule():
    res = _worker('grad-req')
    assert res['auto']['library_op'] and not res['mxnet']['library_op']
    for kernels in ('auto', 'mxnet'):
        first, second = res[kernels]['grads']
        for name in first:   # grad_req='add': the second backward doubles the gradient
            for a, b in zip(first[name], second[name]):
                assert abs(b - 2 * a) <= 1e-5 * max(1.0, abs(a)), (kernels, name)
    for name in res['auto']['grads'][0]:   # the library's gradients are MXNet's, to bf16 noise
        got = res['auto']['grads'][0][name]
        want = res['mxnet']['grads'][0][name]
        scale = max(abs(w) for w in want)
        assert max(abs(g - w) for g, w in zip(got, want)) <= 0.02 * scale, name
    assert any(v != 0 for row in res['auto']['frozen_weight_grad'] for v in row)


def test_without_a_compiler_mxnet_layer_norm_runs(tmp_path):
    res = _worker('fallback', CXX=str(tmp_path / 'no-such-compiler'), PATH=str(tmp_path),
                  MXMP_KERNEL_CACHE=str(tmp_path / 'cache'))
    assert res['library'] is None and 'LayerNorm' in res['ops'] and res['finite']
    assert any('operator library is not available' in w and 'no C++ compiler' in w
               for w in res['warnings'])


@needs_library
def test_a_deferred_layer_norm_takes_its_size_from_the_data():
    # Gluon's LayerNorm without in_channels: gamma and beta reach the library op's shape
    # inference as (-1,) and must take data's last axis (GluonNLP's decoders are built so)
    import numpy as np
    from mxnet import gluon
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, flatten=False), gluon.nn.LayerNorm())
    mx.random.seed(0)   # the weights: a row's variance below depends on them
    net.initialize(mx.init.Xavier(), force_reinit=True)
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 3, 5)))
    mxmp.convert(net, 'bfloat16')
    net.hybridize()
    got = net(x)
    rows = mxmp.explain(mxmp.converted_graph(net), 'bfloat16')
    assert any(r.op == 'mxmp_layer_norm' for r in rows)
    assert net[1].gamma.shape == (16,) and got.shape == (2, 3, 16)
    # normalized rows: mean 0, variance v / (v + eps) for a row of variance v (eps = 1e-5);
    # v from the float32 product (the norm sees it rounded to bfloat16: 0.4% of v at most), the
    # output rounded to bfloat16 (2**-9 relative per value: the bounds below)
    w, b = net[0].weight.data().asnumpy(), net[0].bias.data().asnumpy()
    v = (x.asnumpy() @ w.T + b).var(-1)
    out = got.asnumpy()
    np.testing.assert_allclose(out.mean(-1), 0, atol=4e-3)
    np.testing.assert_allclose(out.var(-1), v / (v + 1e-5), atol=1e-2)
