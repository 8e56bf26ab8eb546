"""cast_params as a state mxmp owns and undoes: remove_hooks() gives the float32 arrays back;
a block mxmp did not convert that shares those Parameters is refused with the fix (it worked
before the conversion and works again after remove_hooks); MXNet's Parameter methods that
cannot take bfloat16 (initialize(force_reinit=True), ParameterDict.zero_grad) work."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.dtypes import dtype_name


def mlp(seed=0):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, in_units=8, activation='relu'), gluon.nn.Dense(3, in_units=16))
    net.initialize(mx.init.Xavier())
    return net


def x_batch():
    return nd.array(np.random.RandomState(0).normal(size=(4, 8)))


def values(net):
    return {k: nd.amp_cast(p.data(), dtype='float32').asnumpy()
            for k, p in net._collect_params_with_prefix().items()}


def test_remove_hooks_gives_back_the_float32_values_from_before_the_cast():
    net = mlp()
    before = values(net)
    mxmp.convert(net, 'bfloat16', cast_params=True)
    assert dtype_name(net[0].weight.dtype) == 'bfloat16'
    mxmp.remove_hooks()
    for p in net.collect_params().values():
        assert dtype_name(p.dtype) == 'float32' and p.data().dtype == np.float32, p.name
    after = values(net)
    for k in before:   # the values kept for the master weights: bit for bit
        np.testing.assert_array_equal(after[k], before[k])
    net.hybridize()
    ref = mlp()
    np.testing.assert_array_equal(net(x_batch()).asnumpy(), ref(x_batch()).asnumpy())


def test_remove_hooks_after_training_gives_the_master_weights_and_a_working_float32_net():
    net = mlp()
    mxmp.convert(net, 'bfloat16', cast_params=True)
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    x = x_batch()
    for _ in range(2):
        with autograd.record():
            loss = net(x).square().sum()
        loss.backward()
        trainer.step(4)
    master = trainer.master_weights(net[0].weight)[0].asnumpy()
    mxmp.remove_hooks()
    assert net[0].weight.data().dtype == np.float32
    np.testing.assert_array_equal(net[0].weight.data().asnumpy(), master)
    assert net[0].weight.grad().dtype == np.float32
    net.hybridize()
    with autograd.record():       # before: "Check failed: (*in_type)[i] == dtype (12 vs. 0)"
        out = net(x)
    out.backward()
    plain = mlp(seed=5)
    for (_, a), (_, b) in zip(sorted(net._collect_params_with_prefix().items()),
                              sorted(plain._collect_params_with_prefix().items())):
        b.set_data(a.data())
    np.testing.assert_array_equal(out.asnumpy(), plain(x).asnumpy())


@pytest.mark.parametrize('hybridized', [True, False])
def test_a_block_sharing_parameters_with_a_converted_one_is_refused_then_works_again(hybridized):
    net = mlp()
    other = gluon.nn.Dense(16, in_units=8, activation='relu', params=net[0].params)
    if hybridized:
        other.hybridize()
    x = x_batch()
    ref = other(x).asnumpy()                  # works before the conversion
    mxmp.convert(net, 'bfloat16', cast_params=True)
    net(x)
    other._clear_cached_op()
    with pytest.raises(RuntimeError, match=r'%s is not converted by mxmp.*%s.*Convert %s too'
                       % (other.name, net[0].weight.name, other.name)):
        other(x)
    mxmp.remove_hooks()
    np.testing.assert_allclose(other(x).asnumpy(), ref, rtol=2 ** -7, atol=2 ** -7 * np.abs(
        ref).max())   # the weights went through bfloat16 once (the first call dropped the rest)


def test_a_block_sharing_parameters_with_a_float32_conversion_is_left_alone():
    net = mlp()
    other = gluon.nn.Dense(16, in_units=8, activation='relu', params=net[0].params)
    other.hybridize()
    mxmp.convert(net, 'bfloat16')
    x = x_batch()
    net(x)
    np.testing.assert_array_equal(other(x).asnumpy(), mlp()[0](x).asnumpy())


@pytest.mark.parametrize('deferred', [False, True])
def test_force_reinit_after_cast_params_initializes_in_float32_and_rounds(deferred):
    net = mlp() if not deferred else gluon.nn.HybridSequential()
    if deferred:
        net.add(gluon.nn.Dense(16, activation='relu'), gluon.nn.Dense(3))
        net.initialize(mx.init.Xavier())
        net(x_batch())
    mxmp.convert(net, 'bfloat16', cast_params=True)
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    trainer.master_weights(net[0].weight)
    plain = mlp(seed=9)
    mx.random.seed(7)
    # before: "Output type must be float16, float32, float64: dtype is 12"
    net.collect_params().initialize(mx.init.Xavier(), force_reinit=True)
    mx.random.seed(7)
    plain.collect_params().initialize(mx.init.Xavier(), force_reinit=True)
    w = net[0].weight
    assert dtype_name(w.dtype) == 'bfloat16'
    want = plain[0].weight.data()
    np.testing.assert_array_equal(
        nd.amp_cast(w.data(), dtype='float32').asnumpy(),
        nd.amp_cast(nd.amp_cast(want, dtype=w.dtype), dtype='float32').asnumpy())
    np.testing.assert_array_equal(trainer.master_weights(w)[0].asnumpy(), want.asnumpy())
    out = net(x_batch())
    assert out.dtype == np.float32 and np.isfinite(out.asnumpy()).all()


def test_zero_grad_on_bfloat16_gradients_and_accumulation():
    """issue 35 item 10: MXNet's ParameterDict.zero_grad failed on bfloat16 gradients
    (reset_arrays: 'Unknown type enum 12'); the accumulation pattern of
    docs/from_contrib_amp.md works."""
    net = mlp()
    mxmp.convert(net, 'bfloat16', cast_params=True)
    params = net.collect_params()
    for p in params.values():
        p.grad_req = 'add'
    x = x_batch()

    def grads():
        return {k: nd.amp_cast(p.grad(), dtype='float32').asnumpy()
                for k, p in params.items()}
    params.zero_grad()
    with autograd.record():
        net(x).sum().backward()
    once = grads()
    with autograd.record():
        net(x).sum().backward()
    twice = grads()
    params.zero_grad()
    assert all(not g.any() for g in grads().values())
    with autograd.record():
        net(x).sum().backward()
    again = grads()
    for k in once:
        assert np.abs(once[k]).sum() > 0, k
        np.testing.assert_array_equal(again[k], once[k])
        np.testing.assert_allclose(twice[k], 2 * once[k], rtol=2 ** -7,
                                   atol=2 ** -7 * np.abs(once[k]).max())


def test_a_sharing_block_built_before_the_conversion_is_refused_at_its_next_call():
    net = mlp()
    other = gluon.nn.Dense(16, in_units=8, activation='relu', params=net[0].params)
    other.hybridize()
    x = x_batch()
    other(x)                                   # its float32 graph is built and cached
    mxmp.convert(net, 'bfloat16', cast_params=True)
    with pytest.raises(RuntimeError, match='%s is not converted by mxmp' % other.name):
        other(x)
