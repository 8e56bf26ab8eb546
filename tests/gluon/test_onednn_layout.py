"""Conversion and casts whatever layout oneDNN left a weight in (mxmp/layout.py).

A float32 inference forward makes MXNet's oneDNN Convolution reorder its weight in place into
oneDNN's blocked layout; for grouped and depthwise convolutions ``amp_cast`` of such a weight
fails ("could not create a primitive descriptor for a reorder primitive"), with or without
bfloat16 kernels. Every test here runs on every machine: real bfloat16 kernels where
``mxmp.lp_kernels_available('bfloat16')``, emulation elsewhere.
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.contrib.amp.amp import bfloat16

import mxmp
from mxmp._src.device import to_default_layout

EMULATE = not mxmp.lp_kernels_available('bfloat16')
EPS = 2.0 ** -8   # bfloat16's relative rounding error (8 significant bits)


def reordered_depthwise_weight():
    """A depthwise Conv2D's weight after one float32 inference forward (oneDNN layout)."""
    net = gluon.nn.Conv2D(16, 3, groups=16, in_channels=16)
    net.initialize()
    net(nd.ones((1, 16, 8, 8))).wait_to_read()
    return net.weight.data()


def grouped_net(seed):
    """Dense conv, depthwise conv, grouped conv (4 groups), with BatchNorm and a classifier."""
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, in_channels=3), gluon.nn.BatchNorm(),
            gluon.nn.Activation('relu'),
            gluon.nn.Conv2D(16, 3, padding=1, groups=16, in_channels=16), gluon.nn.BatchNorm(),
            gluon.nn.Activation('relu'),
            gluon.nn.Conv2D(32, 3, padding=1, groups=4, in_channels=16),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    return net


def rel_err(got, ref):
    return np.abs(got - ref).max() / np.abs(ref).max()


def test_to_default_layout_makes_a_reordered_grouped_weight_castable_in_place():
    w = reordered_depthwise_weight()
    before = w.asnumpy()
    to_default_layout(w)
    cast = nd.amp_cast(w, dtype=bfloat16)
    np.testing.assert_array_equal(w.asnumpy(), before)   # same values, same object
    np.testing.assert_allclose(nd.amp_cast(cast, dtype='float32').asnumpy(), before,
                               rtol=EPS)
    to_default_layout([w, None, nd.ones(3)])   # arrays in the default layout: nothing to do


@pytest.mark.parametrize('cast_params', [False, True])
def test_grouped_and_depthwise_convolutions_convert_after_a_float32_forward(cast_params):
    """The migration path: run the float32 model, convert it, run both, train, run again.

    The float32 forwards between the converted ones reorder the shared weights again; the
    converted block brings them back before its casts. Bound: max|error| / max|output| over
    seeds 0-5 measured 0.0036-0.0075 (real kernels and emulated alike)."""
    for seed in range(3):
        net = grouped_net(seed)
        x = nd.array(np.random.RandomState(seed).uniform(-1, 1, (4, 3, 16, 16)))
        ref = net(x).asnumpy()
        data = mx.sym.var('data')   # a float32 graph over the same Parameters
        plain = gluon.SymbolBlock(net(data), [data], params=net.collect_params())
        # unfused: the bound is the unfused graph's (fusion has its own, tests/gluon/test_fused_inference.py)
        conv = mxmp.convert(net, 'bfloat16', cast_params=cast_params, emulate=EMULATE,
                            fuse_inference=False)
        assert rel_err(conv(x).asnumpy(), ref) <= 3 * EPS
        if not cast_params:   # the float32 graph runs float32 parameters only
            np.testing.assert_array_equal(plain(x).asnumpy(), ref)   # re-reorders the weights
            assert rel_err(conv(x).asnumpy(), ref) <= 3 * EPS
    before = conv(x).asnumpy()
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(conv(x), nd.array([1, 2, 3, 4]))
    loss.backward()
    assert trainer.step(4)
    after = conv(x).asnumpy()
    assert np.all(np.isfinite(after)) and not np.array_equal(after, before)
    if not cast_params:
        assert rel_err(after, plain(x).asnumpy()) <= 3 * EPS


def test_trainer_master_weights_from_a_bfloat16_weight_oneDNN_reordered():
    """cast_params=True with real kernels: a bfloat16 inference forward reorders the bfloat16
    depthwise weight itself; the Trainer's float32 masters are cast from it."""
    net = grouped_net(0)
    x = nd.array(np.random.RandomState(0).uniform(-1, 1, (4, 3, 16, 16)))
    net(x).wait_to_read()
    conv = mxmp.convert(net, 'bfloat16', cast_params=True, emulate=EMULATE)
    conv(x).wait_to_read()
    params = net.collect_params()
    depthwise = [p for n, p in params.items() if p.shape == (16, 1, 3, 3)][0]
    trainer = mxmp.Trainer(params, 'sgd', {'learning_rate': 0.0})
    master = trainer.master_weights(depthwise)[0]
    np.testing.assert_array_equal(
        master.asnumpy(), nd.amp_cast(depthwise.data(), dtype='float32').asnumpy())


def test_convert_model_casts_parameters_oneDNN_reordered():
    """contrib.amp-style migration: parameters that ran an imperative inference Convolution."""
    w = reordered_depthwise_weight()
    data = mx.sym.var('data')
    sym = mx.sym.Convolution(data, mx.sym.var('w'), kernel=(3, 3), num_filter=16, num_group=16,
                             no_bias=True, name='dw')
    _, args, _ = mxmp.amp.convert_model(sym, {'w': w}, {}, target_dtype='bfloat16',
                                        cast_optional_params=True)
    assert args['w'].dtype == bfloat16
    np.testing.assert_allclose(nd.amp_cast(args['w'], dtype='float32').asnumpy(), w.asnumpy(),
                               rtol=EPS)


@pytest.mark.parametrize('name', ['mobilenet1.0', 'mobilenetv2_1.0'])
@pytest.mark.parametrize('cast_params', [False, True])
def test_gluoncv_mobilenets_convert_after_a_float32_forward(name, cast_params):
    """Bound: max|error| / max|output| at 64x64, seeds 0-3: mobilenet1.0 0.0070-0.0126,
    mobilenetv2_1.0 0.0094-0.0115, identical on real kernels and emulated."""
    from gluoncv.model_zoo import get_model
    mx.random.seed(1)
    net = get_model(name, pretrained=False)
    net.initialize(mx.init.Xavier())
    x = nd.array(np.random.RandomState(1).uniform(-1, 1, (1, 3, 64, 64)))
    ref = net(x).asnumpy()
    conv = mxmp.convert(net, 'bfloat16', cast_params=cast_params, emulate=EMULATE,
                        fuse_inference=False)
    assert 0 < rel_err(conv(x).asnumpy(), ref) <= 5 * EPS
