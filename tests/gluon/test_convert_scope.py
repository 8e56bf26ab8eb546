"""A block converted by mxmp.convert inside a hybridized parent the user did not convert: the
parent's graph (Gluon traces the whole parent) plans the child's nodes with the child's settings
and keeps the parent's own in float32; never a silent float32 run, never MXNet's type error."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.dtypes import MSHADOW_ENUM


class Model(gluon.HybridBlock):
    """An encoder (the part the user converts) and a head of its own."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.enc = gluon.nn.HybridSequential()
            self.enc.add(gluon.nn.Dense(32, in_units=8, activation='relu'),
                         gluon.nn.Dense(16, in_units=32))
            self.head = gluon.nn.Dense(3, in_units=16)

    def hybrid_forward(self, F, x):   # pylint: disable=arguments-differ
        return self.head(F.relu(self.enc(x)))


def model(seed=0):
    mx.random.seed(seed)
    net = Model()
    net.initialize(mx.init.Xavier())
    return net


def x_batch():
    return nd.array(np.random.RandomState(0).normal(size=(16, 8)))


def fc_precision(sym):
    """FullyConnected node name -> 'low' if it reads an input the pass rounded or stored in
    bfloat16 (an mxmp cast or emulation node, or a variable declared bfloat16: real kernels
    and emulation alike), else 'float32'."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']

    def low(node):
        attrs = node.get('attrs', {})
        return '__mxmp__' in attrs or attrs.get('__dtype__') == MSHADOW_ENUM['bfloat16']
    return {n['name']: 'low' if any(low(nodes[i]) for i, _, _ in n['inputs']) else 'float32'
            for n in nodes if n['op'] == 'FullyConnected'}


@pytest.mark.parametrize('cast_params', [False, True])
def test_a_child_converted_inside_a_hybridized_parent_runs_in_low_precision(cast_params):
    x = x_batch()
    ref_net = model()
    ref = ref_net(x).asnumpy()
    net = model()
    mxmp.convert(net.enc, 'bfloat16', cast_params=cast_params)
    net.hybridize()
    with autograd.record():
        out = net(x)
    out.backward()
    got = out.asnumpy()
    assert out.dtype == np.float32
    assert not np.array_equal(got, ref)          # before: max difference 0.0 (float32)
    # bfloat16 encoder: measured 0.15-0.71% of max|ref| over seeds 0-5 (both tiers)
    np.testing.assert_allclose(got, ref, atol=0.02 * np.abs(ref).max())
    assert fc_precision(mxmp.converted_graph(net)) == {
        net.enc[0].prefix + 'fwd': 'low', net.enc[1].prefix + 'fwd': 'low',
        net.head.prefix + 'fwd': 'float32'}
    stored = {p.name: mxmp._src.dtypes.dtype_name(p.dtype)
              for p in net.collect_params().values()}
    assert stored[net.head.weight.name] == 'float32'
    assert stored[net.enc[0].weight.name] == ('bfloat16' if cast_params else 'float32')
    for p in net.collect_params().values():       # gradients reached every layer
        grad = nd.amp_cast(p.grad(), dtype='float32').asnumpy()
        assert np.isfinite(grad).all() and np.abs(grad).sum() > 0, p.name
    with pytest.raises(RuntimeError, match=r'inside the graph of its hybridized parent %s'
                       % net.name):
        mxmp.converted_graph(net.enc)


def test_the_parent_trains_with_mxmp_trainer_like_float32():
    x, y = x_batch(), nd.array(np.random.RandomState(1).randint(0, 3, 16))
    losses = {}
    for mode in ('float32', 'child'):
        net = model(seed=2)
        if mode == 'child':
            mxmp.convert(net.enc, 'bfloat16', cast_params=True)
        net.hybridize()
        trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for _ in range(5):
            with autograd.record():
                loss = loss_fn(net(x), y).mean()
            loss.backward()
            trainer.step(1)
        losses[mode] = float(loss.asscalar())
    # measured 0.01-0.21% apart after 5 steps over seeds 0-4 (both tiers)
    assert losses['child'] == pytest.approx(losses['float32'], rel=0.01)


def test_children_converted_with_different_settings_are_refused_at_the_first_call():
    net = model()
    mxmp.convert(net.enc, 'bfloat16')
    mxmp.convert(net.head, 'bfloat16', cast_params=True)
    net.hybridize()
    with pytest.raises(ValueError, match=r'different settings.*mxmp.convert\(%s' % net.name):
        net(x_batch())


def test_a_child_whose_nodes_cannot_be_found_is_refused_not_run_in_float32():
    class Parent(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.body = gluon.nn.Dense(4, in_units=8, prefix='')   # no prefix of its own

        def hybrid_forward(self, F, x):   # pylint: disable=arguments-differ
            return F.relu(self.body(x))
    net = Parent()
    net.initialize()
    mxmp.convert(net.body, 'bfloat16')
    net.hybridize()
    with pytest.raises(RuntimeError, match=r'would run in float32. Convert %s itself'
                       % net.name):
        net(x_batch())


def test_converting_the_parent_afterwards_takes_over():
    x = x_batch()
    net = model()
    mxmp.convert(net.enc, 'bfloat16')
    mxmp.convert(net, 'bfloat16')
    net(x)
    assert set(fc_precision(mxmp.converted_graph(net)).values()) == {'low'}


@pytest.mark.parametrize('cast_params', [False, True])
def test_a_parent_that_ran_before_the_child_was_converted_plans_it_at_the_next_call(
        cast_params):
    x = x_batch()
    net = model()
    net.hybridize()
    ref = net(x).asnumpy()                 # the parent's float32 graph is built and cached
    mxmp.convert(net.enc, 'bfloat16', cast_params=cast_params)
    got = net(x).asnumpy()                 # no hybridize() in between
    assert not np.array_equal(got, ref)
    np.testing.assert_allclose(got, ref, atol=0.02 * np.abs(ref).max())
    assert fc_precision(mxmp.converted_graph(net))[net.enc[0].prefix + 'fwd'] == 'low'
