"""mxmp.convert on Gluon blocks: shared parameters, training, hybridize, export, bad input."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.contrib.amp.amp import bfloat16

import mxmp

EMULATE = not mxmp.lp_kernels_available('bfloat16')


def small_resnet(seed=0):
    from gluoncv.model_zoo import get_model
    mx.random.seed(seed)
    net = get_model('cifar_resnet20_v1', classes=10)
    net.initialize(mx.init.Xavier())
    return net


def batch(n=8, seed=1):
    rng = np.random.RandomState(seed)
    return (nd.array(rng.uniform(-1, 1, (n, 3, 28, 28))),
            nd.array(rng.randint(0, 10, n)))


def is_bf16(arr):
    return np.dtype(arr.dtype).names == ('bfloat16',)


def test_converted_resnet_shares_parameters_with_the_original():
    net = small_resnet()
    conv = mxmp.convert(net, 'bfloat16', emulate=EMULATE)
    mine, theirs = net.collect_params(), conv.collect_params()
    assert set(theirs.keys()) == set(mine.keys())
    assert all(theirs[k] is mine[k] for k in mine.keys())
    x, _ = batch()
    before = net(x).asnumpy()
    name = [k for k in mine.keys() if k.endswith('dense0_bias')][0]
    mine[name].set_data(mine[name].data() + 1)  # an update through one ...
    np.testing.assert_allclose(net(x).asnumpy(), before + 1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(conv(x).asnumpy(), before + 1, rtol=0.05, atol=0.05)  # ... seen


def test_converted_resnet_output_is_float32_and_close_to_float32():
    net = small_resnet()
    x, _ = batch()
    ref = net(x).asnumpy()
    out = mxmp.convert(net, 'bfloat16', emulate=EMULATE)(x)
    assert out.dtype == np.float32
    got = out.asnumpy()
    np.testing.assert_allclose(got, ref, rtol=0.1, atol=0.05 * np.abs(ref).max())
    assert not np.array_equal(got, ref)


@pytest.mark.parametrize('cast_params', [False, True])
def test_converted_resnet_trains_like_float32(cast_params):
    x, y = batch(16)
    losses = {}
    for mode in ('float32', 'bfloat16'):
        net = small_resnet(seed=3)
        if mode == 'bfloat16':
            net = mxmp.convert(net, 'bfloat16', cast_params=cast_params, emulate=EMULATE)
            net.hybridize()
        trainer = mxmp.Trainer(net.collect_params(), 'sgd',
                               {'learning_rate': 0.05, 'momentum': 0.9})
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        history = []
        for _ in range(8):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(x.shape[0])
            history.append(loss.mean().asscalar())
        losses[mode] = history
    assert losses['bfloat16'][-1] < 0.6 * losses['bfloat16'][0]  # it learns the batch
    np.testing.assert_allclose(losses['bfloat16'], losses['float32'], rtol=0.15, atol=0.05)


def test_cast_params_stores_conv_and_dense_weights_in_bfloat16_but_not_batchnorm():
    net = small_resnet()
    net(batch()[0])  # finish deferred initialization
    conv = mxmp.convert(net, 'bfloat16', cast_params=True, emulate=EMULATE)
    params = net.collect_params()
    for name, p in params.items():
        if 'batchnorm' in name:
            assert p.dtype == np.float32 and p.data().dtype == np.float32, name
        elif name.endswith('weight') or name.endswith('bias'):
            assert is_bf16(p.data()), name
    assert conv.mxmp_cast_params


def test_cast_params_before_initialize_initializes_in_bfloat16():
    net = gluon.nn.Dense(4)
    conv = mxmp.convert(net, 'bfloat16', cast_params=True, emulate=True)
    conv.initialize(mx.init.Xavier())
    out = conv(nd.ones((2, 3)))
    assert is_bf16(net.weight.data()) and net.weight.shape == (4, 3)
    assert out.dtype == np.float32


def test_convert_before_initialize_and_before_shapes_are_known():
    net = gluon.nn.HybridSequential()
    with net.name_scope():
        net.add(gluon.nn.Dense(16, activation='relu'), gluon.nn.Dense(4))
    conv = mxmp.convert(net, 'bfloat16', emulate=EMULATE)
    conv.initialize(mx.init.Xavier())  # deferred: shapes come from the first batch
    x = nd.ones((2, 7))
    out = conv(x)
    assert out.shape == (2, 4) and out.dtype == np.float32
    assert net[0].weight.shape == (16, 7)
    np.testing.assert_allclose(out.asnumpy(), net(x).asnumpy(), rtol=0.05, atol=0.02)


def test_convert_a_hybridized_block_and_hybridize_the_result():
    net = small_resnet()
    net.hybridize()
    x, _ = batch()
    ref = net(x).asnumpy()
    conv = mxmp.convert(net, 'bfloat16', emulate=EMULATE)
    conv.hybridize(static_alloc=True, static_shape=True)
    for _ in range(2):
        np.testing.assert_allclose(conv(x).asnumpy(), ref, rtol=0.1,
                                   atol=0.05 * np.abs(ref).max())


@pytest.mark.parametrize('cast_params', [False, True])
def test_export_writes_a_float32_model_that_plain_mxnet_loads(tmp_path, cast_params):
    net = small_resnet()
    net(batch()[0])
    conv = mxmp.convert(net, 'bfloat16', emulate=EMULATE, cast_params=cast_params)
    x, _ = batch()
    conv.hybridize()
    conv(x)
    prefix = str(tmp_path / 'model')
    conv.export(prefix)
    loaded = gluon.SymbolBlock.imports(prefix + '-symbol.json', ['data'],
                                       prefix + '-0000.params')
    sym = mx.sym.load(prefix + '-symbol.json')
    assert mxmp.count_casts(sym)['amp_cast'] == 0
    assert all(np.dtype(p.data().dtype) == np.float32 for p in loaded.collect_params().values())
    # The exported float32 model computes what the original (shared, possibly rounded)
    # parameters compute in float32.
    reference = mxmp.remove_casts(conv.mxmp_symbol)
    args = {k: nd.amp_cast(p.data(), dtype='float32') for k, p in net.collect_params().items()}
    args['data'] = x
    exe = reference.bind(mx.cpu(), {k: v for k, v in args.items()
                                   if k in reference.list_arguments()},
                         aux_states={k: args[k] for k in reference.list_auxiliary_states()})
    np.testing.assert_allclose(loaded(x).asnumpy(), exe.forward()[0].asnumpy(), rtol=1e-4,
                               atol=1e-5)


def test_block_with_two_inputs():
    class TwoInputs(gluon.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.fc = gluon.nn.Dense(3, in_units=4)

        def hybrid_forward(self, F, a, b):
            return F.broadcast_add(self.fc(a), F.sum(b, axis=1, keepdims=True))

    net = TwoInputs()
    net.initialize()
    conv = mxmp.convert(net, 'bfloat16', emulate=EMULATE, data_names=('a', 'b'))
    a, b = nd.ones((2, 4)), nd.ones((2, 5))
    np.testing.assert_allclose(conv(a, b).asnumpy(), net(a, b).asnumpy(), rtol=0.02, atol=0.02)


# --- bad input --------------------------------------------------------------------------------
def test_plain_block_is_rejected_with_the_fix():
    class NotHybrid(gluon.Block):
        def forward(self, x):
            return x * 2

    with pytest.raises(TypeError, match='needs a gluon.HybridBlock.*hybrid_forward'):
        mxmp.convert(NotHybrid(), 'bfloat16')


def test_untraceable_hybrid_block_is_rejected_with_the_fix():
    class UsesNumpy(gluon.HybridBlock):
        def hybrid_forward(self, F, x):
            return x * float(x.asnumpy().sum())

    with pytest.raises(TypeError, match='could not trace.*only F'):
        mxmp.convert(UsesNumpy(), 'bfloat16')


def test_converting_a_converted_block_raises():
    conv = mxmp.convert(small_resnet(), 'bfloat16', emulate=True)
    with pytest.raises(ValueError, match='already converted.*mxmp_source'):
        mxmp.convert(conv, 'bfloat16')


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="unknown target dtype 'float8'"):
        mxmp.convert(small_resnet(), 'float8')


@pytest.mark.skipif(not EMULATE, reason='this CPU has bfloat16 kernels')
def test_missing_bfloat16_kernels_give_a_clear_error_before_running():
    conv = mxmp.convert(small_resnet(), 'bfloat16')
    x, _ = batch()
    with pytest.raises(RuntimeError, match='no bfloat16 kernels.*emulate=True'):
        conv(x)


def test_float16_on_cpu_is_reported_as_unavailable():
    assert mxmp.lp_kernels_available('float16', mx.cpu()) is False
    conv = mxmp.convert(small_resnet(), 'float16')
    with pytest.raises(RuntimeError, match='no float16 kernels'):
        conv(batch()[0])


def test_emulated_float16_runs_on_cpu():
    net = small_resnet()
    x, _ = batch()
    out = mxmp.convert(net, 'float16', emulate=True)(x)
    ref = net(x).asnumpy()
    np.testing.assert_allclose(out.asnumpy(), ref, rtol=0.02, atol=0.01 * np.abs(ref).max())


def test_parameters_are_marked_with_the_target_dtype_for_the_trainer():
    net = small_resnet()
    mxmp.convert(net, 'float16', emulate=True)
    assert {p._mxmp_target_dtype for p in net.collect_params().values()} == {'float16'}


def test_bfloat16_parameter_values_are_rounded_to_nearest():
    net = gluon.nn.Dense(4, in_units=3)
    net.initialize()
    w = net.weight.data().asnumpy()
    mxmp.convert(net, 'bfloat16', cast_params=True, emulate=True)
    got = nd.amp_cast(net.weight.data(), dtype='float32').asnumpy()
    assert is_bf16(net.weight.data())
    # round to nearest: error at most half a bfloat16 ulp (2**-8 relative)
    assert np.all(np.abs(got - w) <= np.abs(w) * 2.0 ** -8 + 1e-30)
    assert bfloat16 is not None
