"""Fused inference (mxmp._src.gluon_graph): oneDNN's fused graph for inference calls, the unfused one for
training; structure and numerics on any machine (fusion exists for float32 too), bfloat16
numerics where the real kernels run, stale-state protection, refusal, and `mxmp convert --fuse`.
"""
import json
import logging
import os
import subprocess
import sys
from collections import Counter

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxmp
from mxmp.cli import main

KERNELS = mxmp.lp_kernels_available('bfloat16')
EMULATE = not KERNELS
#: Fused vs unfused bfloat16 outputs of tiny_net, |difference| / max |unfused output|: measured
#: 0.0043-0.0071 over seeds 0-5 [avx512_bf16] (BatchNorm folded into the weights before
#: rounding); the bound is 4x the largest.
BF16_FUSED_REL = 0.03
#: The same with every op in float32 (rounding order of the folded weights only): 1e-6 scale.
FP32_FUSED_REL = 1e-4


def real_kernels_only(test):
    """Mark ``test`` real_kernels and skip it without oneDNN bfloat16 kernels."""
    return pytest.mark.real_kernels(pytest.mark.skipif(
        not KERNELS, reason='needs oneDNN bfloat16 kernels (avx512_bf16/AMX)')(test))


def tiny_net(seed, prefix=None):
    """conv+BN+ReLU, strided conv+BN+ReLU, pool, dense; BatchNorm statistics not at identity."""
    mx.random.seed(seed)
    net = nn.HybridSequential(prefix=prefix or 'tiny%d_' % seed)
    with net.name_scope():
        net.add(nn.Conv2D(16, 3, padding=1, in_channels=3), nn.BatchNorm(in_channels=16),
                nn.Activation('relu'),
                nn.Conv2D(16, 3, strides=2, padding=1, in_channels=16),
                nn.BatchNorm(in_channels=16), nn.Activation('relu'),
                nn.GlobalAvgPool2D(), nn.Dense(10, in_units=16))
    net.initialize(mx.init.Xavier())
    for p in net.collect_params('.*running_mean|.*running_var|.*gamma|.*beta').values():
        p.set_data(mx.nd.random.uniform(0.5, 1.5, shape=p.shape))
    return net


def data(seed=0, batch=4):
    return mx.nd.array(np.random.RandomState(seed).normal(size=(batch, 3, 16, 16)))


def ops(sym):
    return Counter(n['op'] for n in json.loads(sym.tojson(remove_amp_cast=False))['nodes'])


def unfused(block, x):
    """The same block's output through its unfused graph (a call under autograd.record() in
    predict mode: the inference graph, never fused)."""
    with autograd.record(train_mode=False):
        return block(x).asnumpy()


def fused_symbol(block):
    return mxmp._src.gluon.fused_graph(block)


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def fp32_policy():
    """Everything in float32: the graph fuses (and folds BatchNorm) on any CPU."""
    return mxmp.Policy('bfloat16', emulate=True, fp32_ops=('Convolution', 'FullyConnected'))


# ------------------------------------------------------------------------------ structure
def test_fused_graph_holds_onednn_conv_nodes_and_folds_batchnorm_any_machine():
    net = tiny_net(0)
    x = data()
    ref32 = net(x).asnumpy()
    block = mxmp.convert(net, policy=fp32_policy(), fuse_inference=True)
    block.hybridize(static_alloc=True, static_shape=True)
    assert fused_symbol(block) is None  # built by the first inference call
    out = block(x).asnumpy()
    fused = ops(fused_symbol(block))
    assert fused['_sg_mkldnn_conv'] == 2
    assert fused['BatchNorm'] == 0 and fused['Activation'] == 0  # folded into the convolutions
    assert ops(mxmp.converted_graph(block))['BatchNorm'] == 2  # the training graph keeps them
    ref = unfused(block, x)
    assert not np.array_equal(out, ref)  # BatchNorm folded: another rounding order
    assert rel(out, ref) < FP32_FUSED_REL
    assert rel(out, ref32) < FP32_FUSED_REL


def test_emulated_graph_fuses_only_when_asked_and_keeps_emulation_numerics():
    x = data()
    auto = mxmp.convert(tiny_net(1), 'bfloat16', emulate=True)  # fuse_inference='auto'
    auto.hybridize(static_alloc=True, static_shape=True)
    auto(x)
    assert fused_symbol(auto) is None  # 'auto' fuses only real low-precision kernels
    forced = mxmp.convert(tiny_net(1), 'bfloat16', emulate=True, fuse_inference=True)
    forced.hybridize(static_alloc=True, static_shape=True)
    out = forced(x).asnumpy()
    assert ops(fused_symbol(forced))['_sg_mkldnn_conv'] == 2
    # Emulation's rounding nodes sit between convolution and BatchNorm: nothing folds, and the
    # numbers stay those of emulation.
    np.testing.assert_array_equal(out, unfused(forced, x))


@real_kernels_only
@pytest.mark.parametrize('cast_params', [False, True])
def test_real_kernels_fuse_by_default_within_bfloat16_tolerance(cast_params):
    for seed in range(3):
        net = tiny_net(seed)
        x = data(seed)
        ref = net(x).asnumpy()
        block = mxmp.convert(net, 'bfloat16', cast_params=cast_params)
        block.hybridize(static_alloc=True, static_shape=True)
        out = block(x).asnumpy()
        fused = ops(fused_symbol(block))
        assert fused['_sg_mkldnn_conv'] == 2 and fused['BatchNorm'] == 0
        assert rel(out, unfused(block, x)) < BF16_FUSED_REL
        assert rel(out, ref) < BF16_FUSED_REL


@real_kernels_only
def test_deferred_shapes_are_inferred_before_the_fused_graph_casts_its_weight_copies():
    net = nn.HybridSequential(prefix='deferred_')
    with net.name_scope():  # no in_channels / in_units: shapes wait for the first batch
        net.add(nn.Conv2D(8, 3), nn.BatchNorm(), nn.Activation('relu'), nn.Dense(4))
    net.initialize(mx.init.Xavier())
    block = mxmp.convert(net, 'bfloat16')
    block.hybridize(static_alloc=True, static_shape=True)
    x = data()
    out = block(x).asnumpy()
    assert ops(fused_symbol(block))['_sg_mkldnn_conv'] == 1
    assert rel(out, unfused(block, x)) < BF16_FUSED_REL


def test_fuse_inference_false_never_fuses():
    x = data()
    off = mxmp.convert(tiny_net(2), policy=fp32_policy(), fuse_inference=False)
    off.hybridize(static_alloc=True, static_shape=True)
    off(x)
    assert fused_symbol(off) is None


def test_bad_fuse_inference_value_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="'auto'.*True.*False"):
        mxmp.convert(tiny_net(0), 'bfloat16', emulate=True, fuse_inference='yes')


# ------------------------------------------------------------------------------ training
def test_training_runs_the_unfused_graph_with_identical_outputs_and_gradients():
    x, y = data(3), mx.nd.array([1, 2, 3, 4])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    results = []
    for fuse in (True, False):
        block = mxmp.convert(tiny_net(3), policy=fp32_policy(), fuse_inference=fuse)
        block.hybridize(static_alloc=True, static_shape=True)
        block(x)  # an inference call first: the fused graph exists (when fuse)
        with autograd.record():
            out = block(x)
            loss_fn(out, y).backward()
        grads = {k[len('tiny3_'):]: p.grad().asnumpy()
                 for k, p in block.collect_params().items() if p.grad_req != 'null'}
        results.append((out.asnumpy(), grads))
        with autograd.train_mode():  # batch statistics: never the fused (folded) graph
            np.testing.assert_array_equal(block(x).asnumpy(), out.asnumpy())
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for k in results[0][1]:
        np.testing.assert_array_equal(results[0][1][k], results[1][1][k])


def fresh_fused(block, x):
    """The output of a newly built fused graph on the same parameters (a cache clear builds
    the graphs anew)."""
    block.hybridize(static_alloc=True, static_shape=True)
    return block(x).asnumpy()


@pytest.mark.parametrize('real', [
    False, pytest.param(True, marks=[pytest.mark.real_kernels, pytest.mark.skipif(
        not KERNELS, reason='needs oneDNN bfloat16 kernels (avx512_bf16/AMX)')])])
def test_fused_graph_is_rebuilt_after_training_steps_and_set_data(real):
    """MXNet's fused FullyConnected keeps its first weights, and a fused conv+BatchNorm does not
    see BatchNorm changes: the twin must be rebuilt, or inference after training is stale.
    real: bfloat16 kernels with float32 weights (the fused graph runs bfloat16 copies)."""
    x, y = data(4), mx.nd.array([1, 2, 3, 4])
    policy = mxmp.Policy('bfloat16') if real else fp32_policy()
    block = mxmp.convert(tiny_net(4), policy=policy, fuse_inference=True)
    block.hybridize(static_alloc=True, static_shape=True)
    before = block(x).asnumpy()
    trainer = mxmp.Trainer(block.collect_params(), 'sgd', {'learning_rate': 0.1})
    for _ in range(2):
        with autograd.record():
            gluon.loss.SoftmaxCrossEntropyLoss()(block(x), y).backward()
        trainer.step(4)
    after = block(x).asnumpy()
    assert not np.array_equal(after, before)
    np.testing.assert_array_equal(after, fresh_fused(block, x))
    for name, p in block.collect_params().items():
        if name.endswith(('running_mean', 'dense0_weight')):
            p.set_data(p.data() + 0.25)
    changed = block(x).asnumpy()
    assert not np.array_equal(changed, after)
    np.testing.assert_array_equal(changed, fresh_fused(block, x))
    assert rel(changed, unfused(block, x)) < (BF16_FUSED_REL if real else FP32_FUSED_REL)


def test_a_graph_without_fusible_patterns_runs_unfused_with_a_log_line(caplog):
    class Scale(gluon.HybridBlock):
        def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
            return F.relu(x) * 2

    block = mxmp.convert(Scale(), policy=fp32_policy(), fuse_inference=True)
    block.hybridize(static_alloc=True, static_shape=True)
    with caplog.at_level(logging.WARNING, logger='mxmp.gluon'):
        out = block(data()).asnumpy()
        block(data())
    np.testing.assert_array_equal(out, np.maximum(data().asnumpy(), 0) * 2)
    lines = [r.getMessage() for r in caplog.records if 'fusion refused' in r.getMessage()]
    assert len(lines) == 1 and 'no fusible pattern' in lines[0]  # logged once
    assert fused_symbol(block) is None


# ------------------------------------------------------------------------------ mxmp convert --fuse
def test_cli_convert_fuse_writes_a_graph_plain_mxnet_loads(tmp_path, capsys):
    net = tiny_net(5, prefix='tiny_')
    net.hybridize()
    x = data(5)
    net(x)
    net.export(str(tmp_path / 'tiny'))
    args = ['convert', tmp_path / 'tiny-symbol.json', tmp_path / 'tiny-0000.params',
            '--dtype', 'bfloat16', '--out']
    extra = ['--emulate'] if EMULATE else ['--cast-params']
    assert main([str(a) for a in args + [tmp_path / 'plain'] + extra]) == 0
    assert main([str(a) for a in args + [tmp_path / 'fused', '--fuse'] + extra]) == 1
    assert '--shape data=1,3,224,224' in capsys.readouterr().err  # the fix is named
    assert main([str(a) for a in args + [tmp_path / 'fused', '--fuse', '--shape',
                                         'data=1,3,16,16'] + extra]) == 0
    stdout = capsys.readouterr().out
    assert 'fused for inference' in stdout
    fused = mx.sym.load(str(tmp_path / 'fused-symbol.json'))
    assert ops(fused)['_sg_mkldnn_conv'] == 2
    # BatchNorm folded by mxmp in float32 (the files hold the folded weights, not BatchNorm's)
    assert 'tiny_conv0_fwd_bnfold_weight' in fused.list_arguments()
    assert not [n for n in json.loads(fused.tojson())['nodes']
                if n.get('attrs', {}).get('with_bn') == 'true']
    saved = mx.nd.load(str(tmp_path / 'fused-0000.params'))
    assert 'arg:tiny_conv0_fwd_bnfold_bias' in saved and 'aux:tiny_batchnorm0_running_var' \
        not in saved
    np.save(tmp_path / 'x.npy', x.asnumpy())
    # Plain MXNet, no mxmp on the path: both graphs load and run (batch 4; fused with 1).
    script = ('import sys, numpy as np, mxnet as mx\n'
              'd = sys.argv[1]\n'
              'x = mx.nd.array(np.load(d + "/x.npy"))\n'
              'for name in ("plain", "fused"):\n'
              '    b = mx.gluon.SymbolBlock.imports(d + "/%s-symbol.json" % name, ["data"],\n'
              '                                     d + "/%s-0000.params" % name)\n'
              '    np.save(d + "/%s.npy" % name, b(x).asnumpy())\n'
              'assert "mxmp" not in sys.modules\n')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([sys.executable, '-c', script, str(tmp_path)], env=env, cwd='/',
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plain, fused_out = np.load(tmp_path / 'plain.npy'), np.load(tmp_path / 'fused.npy')
    assert rel(fused_out, plain) < BF16_FUSED_REL
    assert rel(fused_out, net(x).asnumpy()) < BF16_FUSED_REL


class TwoHeads(gluon.HybridBlock):
    """Logits and their sigmoid: the logits output also feeds another node."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv = nn.Conv2D(8, 3, in_channels=3)
            self.dense = nn.Dense(4, in_units=8 * 14 * 14)

    def hybrid_forward(self, F, x):  # pylint: disable=arguments-differ
        logits = self.dense(F.relu(self.conv(x)))
        return logits, F.sigmoid(logits)


def test_an_output_that_also_feeds_another_node_is_never_fused(caplog):
    """MXNet's fusion returned sigmoid(FC) for an FC output that is also a graph output."""
    net = TwoHeads(prefix='heads_')
    net.initialize(mx.init.Xavier())
    x = data()
    ref = [o.asnumpy() for o in net(x)]
    block = mxmp.convert(net, policy=fp32_policy(), fuse_inference=True)
    block.hybridize(static_alloc=True, static_shape=True)
    with caplog.at_level(logging.WARNING, logger='mxmp.gluon'):
        logits, prob = block(x)
    assert fused_symbol(block) is None
    assert any('also feeds another node' in r.getMessage() for r in caplog.records)
    np.testing.assert_allclose(logits.asnumpy(), ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(prob.asnumpy(), ref[1], rtol=1e-5, atol=1e-6)



def test_cli_convert_fuse_refuses_an_output_that_also_feeds_another_node(tmp_path, capsys):
    # --strip keeps the float32 graph, whose logits output feeds the sigmoid directly.
    net = TwoHeads(prefix='heads_')
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(data())
    net.export(str(tmp_path / 'heads'))
    args = ['convert', tmp_path / 'heads-symbol.json', tmp_path / 'heads-0000.params',
            '--strip', '--fuse', '--shape', 'data=1,3,16,16', '--out', tmp_path / 'fused']
    assert main([str(a) for a in args]) == 1
    err = capsys.readouterr().err
    assert 'heads_dense0_fwd' in err and 'convert without --fuse' in err
    assert not (tmp_path / 'fused-symbol.json').exists()

@real_kernels_only
def test_auto_follows_mxnet_subgraph_backend_none(monkeypatch):
    x = data()
    block = mxmp.convert(tiny_net(6), 'bfloat16')
    block.hybridize(static_alloc=True, static_shape=True)
    monkeypatch.setenv('MXNET_SUBGRAPH_BACKEND', 'NONE')
    out = block(x).asnumpy()
    assert fused_symbol(block) is None
    # unfused real kernels: bit-identical to emulation
    emulated = mxmp.convert(tiny_net(6), 'bfloat16', emulate=True)
    emulated.hybridize(static_alloc=True, static_shape=True)
    np.testing.assert_array_equal(out, emulated(x).asnumpy())
    monkeypatch.delenv('MXNET_SUBGRAPH_BACKEND')
    block(x)
    assert fused_symbol(block) is not None


# ------------------------------------------------------------------ BatchNorm folded by mxmp
def bfloat16_round(a):
    """float32 -> the nearest bfloat16 (ties to even), as float32: the pass's amp_cast."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def twin_values(block):
    twin = mxmp._src.gluon._BUILT[block].fused.twin
    return {k: mx.nd.amp_cast(p.data(), dtype='float32').asnumpy()
            for k, p in twin.collect_params().items()}


@real_kernels_only
@pytest.mark.parametrize('cast_params', [False, True])
def test_fused_convolutions_get_batchnorm_folded_in_float32_and_rounded_once(cast_params):
    """MXNet folds BatchNorm into a bfloat16 convolution by truncation (docs/benchmark.md);
    mxmp gives the fused graph convolutions whose weight and bias are the float32 fold rounded
    to nearest even once (from the bfloat16 weight under cast_params), and no BatchNorm."""
    net = tiny_net(5)
    float32 = {k[len('tiny5_'):]: p.data().asnumpy() for k, p in net.collect_params().items()}
    block = mxmp.convert(net, 'bfloat16', cast_params=cast_params)
    block.hybridize(static_alloc=True, static_shape=True)
    x = data(5)
    out = block(x).asnumpy()
    nodes = [n for n in json.loads(fused_symbol(block).tojson())['nodes']
             if n['op'] == '_sg_mkldnn_conv']
    assert len(nodes) == 2 and not [n for n in nodes if n['attrs'].get('with_bn') == 'true']
    values = twin_values(block)
    for conv, bn in (('conv0', 'batchnorm0'), ('conv1', 'batchnorm1')):
        w = float32[conv + '_weight']
        if cast_params:
            w = bfloat16_round(w)
        scale = float32[bn + '_gamma'] / np.sqrt(float32[bn + '_running_var'] + 1e-5)
        want_w = bfloat16_round(w * scale[:, None, None, None])
        want_b = bfloat16_round(float32[bn + '_beta'] + (float32[conv + '_bias'] -
                                                          float32[bn + '_running_mean']) * scale)
        got_w = values['tiny5_%s_fwd_bnfold_weight' % conv]
        # at most one bfloat16 ulp from float32's own rounding of the product
        assert np.abs(got_w - want_w).max() <= np.abs(want_w).max() * 2 ** -8
        assert (got_w == want_w).mean() > 0.99
        np.testing.assert_allclose(values['tiny5_%s_fwd_bnfold_bias' % conv], want_b,
                                   rtol=2 ** -8)
    assert rel(out, unfused(block, x)) < BF16_FUSED_REL
    # MXNet's own fold, for comparison: the fused nodes fold BatchNorm themselves
    other = mxmp.convert(tiny_net(5, prefix='other5_'), 'bfloat16', cast_params=cast_params,
                         fold_batchnorm=False)
    other.hybridize(static_alloc=True, static_shape=True)
    other(x)
    assert [n['attrs'].get('with_bn') for n in json.loads(fused_symbol(other).tojson())['nodes']
            if n['op'] == '_sg_mkldnn_conv'] == ['true', 'true']


class ConcatWeights(gluon.HybridBlock):
    """GluonNLP's attention-cell pattern: weights reshaped and concatenated on every call (the
    query, key and value weights), then one FullyConnected."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.w1 = self.params.get('w1', shape=(8, 6), init=mx.init.Normal(0.5))
            self.w2 = self.params.get('w2', shape=(8, 6), init=mx.init.Normal(0.5))
            self.b = self.params.get('b', shape=(16,), init=mx.init.Normal(0.5))

    def hybrid_forward(self, F, x, w1, w2, b):
        w = F.concat(F.reshape(w1, (2, -1, 0), reverse=True),
                     F.reshape(w2, (2, -1, 0), reverse=True), dim=-2)
        return F.relu(F.FullyConnected(x, F.reshape(w, (-1, 0), reverse=True), b,
                                       num_hidden=16))


def concat_weights_reference(block, x):
    """float64 numpy of ConcatWeights on the block's current float32 parameters."""
    p = {k.split('_')[-1]: v.data().asnumpy().astype(np.float64)
         for k, v in block.collect_params().items()}
    w = np.concatenate([p['w1'].reshape(2, 4, 6), p['w2'].reshape(2, 4, 6)], axis=-2)
    return np.maximum(x.asnumpy() @ w.reshape(-1, 6).T + p['b'], 0)


@pytest.mark.parametrize('real', [
    False, pytest.param(True, marks=[pytest.mark.real_kernels, pytest.mark.skipif(
        not KERNELS, reason='needs oneDNN bfloat16 kernels (avx512_bf16/AMX)')])])
def test_fused_graph_computes_weight_only_nodes_once_per_build_and_after_each_step(real):
    """The twin folds what it computes from weights alone (the reshapes and the concatenation)
    into variables at each build: none of those nodes runs per call, and after training steps
    inference reads the new weights, not the values folded at the first build."""
    mx.random.seed(7)
    net = ConcatWeights(prefix='cw_')
    net.initialize()
    x = mx.nd.array(np.random.RandomState(7).normal(size=(5, 6)))
    policy = mxmp.Policy('bfloat16') if real else fp32_policy()
    block = mxmp.convert(net, policy=policy, fuse_inference=True)
    block.hybridize(static_alloc=True, static_shape=True)
    tol = BF16_FUSED_REL if real else FP32_FUSED_REL
    before = block(x).asnumpy()
    fused = ops(fused_symbol(block))
    assert fused['_sg_mkldnn_fully_connected'] == 1
    concat = {'Concat', 'concat', '_npi_concatenate'}
    assert not (concat | {'Reshape', 'reshape'}) & set(fused)
    trained = ops(mxmp.converted_graph(block))   # the training graph keeps them
    assert sum(trained[op] for op in concat) == 1 and trained['Reshape'] == 3
    assert rel(before, concat_weights_reference(block, x)) < tol
    trainer = mxmp.Trainer(block.collect_params(), 'sgd', {'learning_rate': 0.5})
    for _ in range(2):
        with autograd.record():
            block(x).sum().backward()
        trainer.step(5)
    after = block(x).asnumpy()
    assert rel(after, before) > 10 * tol
    assert rel(after, concat_weights_reference(block, x)) < tol
    assert rel(after, unfused(block, x)) < tol
