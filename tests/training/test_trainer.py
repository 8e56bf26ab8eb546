"""Tests of mxmp._src.training.trainer.Trainer: loss scaling, overflow skipping, master weights, checkpoints.

CPU only. float16/bfloat16 matrix products do not run on every CPU (MXNet 1.9.1 has no float16
GEMM on CPU; oneDNN's bfloat16 kernels need AVX-512), so the low-precision networks here store
their Parameters in float16/bfloat16 and ``amp_cast`` them to float32 right before
FullyConnected: the Parameters and their gradients are real low-precision arrays (and the
Trainer keeps real float32 master weights for them); only the product runs in float32.
"""
import os

import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, gluon, nd
from mxnet.gluon import nn
from mxnet.contrib.amp.amp import bfloat16

from mxmp._src.scaling import DynamicLossScaler, NoOpLossScaler, StaticLossScaler
from mxmp._src.training.trainer import Trainer
from helpers import CastDense, LP_DTYPES, cast_mlp, f32, fresh_trainer, linear_backward, linear_batches, optimizer_state, params_of, set_random_params, trained_bf16_trainer  # noqa: E402

#: Significand bits (with the implicit one) of the low-precision dtypes: a value m in
#: [2**e, 2**(e+1)) rounds to within half a unit in the last place, 2**(e - BITS).
BITS = {'bfloat16': 8, 'float16': 11}


def mlp(prefix, ctx=None, seed=0):
    """Two float32 Dense layers with random weights that depend only on ``seed``."""
    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(nn.Dense(5, in_units=4, activation='tanh'), nn.Dense(3, in_units=5))
    net.initialize(mx.init.Zero(), ctx=ctx or mx.cpu())
    set_random_params(net, seed)
    return net


def snapshot(net):
    return [f32(d) for p in params_of(net) for d in p.list_data()]


def batches(n, seed=1, batch=6):
    rng = np.random.RandomState(seed)
    return [(nd.array(rng.randn(batch, 4)), nd.array(rng.randn(batch, 3))) for _ in range(n)]


def backward(net, trainer, x, y, ctxs=None):
    """L2 loss forward + backward, through trainer.scale_loss for an mxmp Trainer; with
    several contexts the batch is split evenly across them."""
    ctxs = ctxs or [mx.cpu()]
    xs = gluon.utils.split_and_load(x, ctxs)
    ys = gluon.utils.split_and_load(y, ctxs)
    with autograd.record():
        losses = [((net(xi) - yi) ** 2).sum() for xi, yi in zip(xs, ys)]
        if isinstance(trainer, Trainer):
            with trainer.scale_loss(losses) as scaled:
                autograd.backward(scaled)
        else:
            autograd.backward(losses)


def train(net, trainer, data, ctxs=None):
    results = []
    for x, y in data:
        backward(net, trainer, x, y, ctxs)
        results.append(trainer.step(x.shape[0]))
    return results


def assert_states_equal(a, b):
    arrays_a, counts_a, num_a = a
    arrays_b, counts_b, num_b = b
    assert len(arrays_a) == len(arrays_b)
    for x, y in zip(arrays_a, arrays_b):
        np.testing.assert_array_equal(x, y)
    assert (counts_a, num_a) == (counts_b, num_b)


OPTIMIZERS = [('sgd', {'learning_rate': .05, 'momentum': .9, 'wd': 1e-3}),
              ('adam', {'learning_rate': .01}),
              ('nag', {'learning_rate': .05, 'momentum': .9})]


# ---------------------------------------------------------------------------- construction
def test_update_on_kvstore_true_is_refused_with_the_reason():
    net = mlp('a_')
    with pytest.raises(ValueError, match='update_on_kvstore=True.*reduced gradients'):
        Trainer(net.collect_params(), 'sgd', update_on_kvstore=True)


def test_async_kvstore_is_refused():
    net = mlp('a_')
    with pytest.raises(ValueError, match='async'):
        Trainer(net.collect_params(), 'sgd', kvstore='dist_async')


def test_target_dtype_and_default_loss_scaler_follow_the_parameters():
    f32_net, f16_net, bf16_net = mlp('a_'), cast_mlp('b_', 'float16'), cast_mlp('c_', 'bfloat16')
    t = Trainer(f32_net.collect_params(), 'sgd')
    assert (t.target_dtype, type(t.loss_scaler)) == ('float32', NoOpLossScaler)
    t = Trainer(f16_net.collect_params(), 'sgd')
    assert (t.target_dtype, type(t.loss_scaler)) == ('float16', DynamicLossScaler)
    assert t.loss_scale == 2.0 ** 16
    t = Trainer(bf16_net.collect_params(), 'sgd')
    assert (t.target_dtype, type(t.loss_scaler)) == ('bfloat16', NoOpLossScaler)


def test_target_dtype_is_the_one_the_network_was_converted_to():
    import mxmp
    net = mlp('a_')
    mxmp.convert(net, 'float16')
    t = Trainer(net.collect_params(), 'sgd')
    assert t.target_dtype == 'float16' and t.loss_scaler.dynamic
    t = Trainer(net.collect_params(), 'sgd', target_dtype='bfloat16', loss_scaler=512)
    assert t.target_dtype == 'bfloat16' and t.loss_scaler == StaticLossScaler(512.)


def test_invalid_target_dtype_and_loss_scaler_raise():
    net = mlp('a_')
    with pytest.raises(ValueError, match='int8'):
        Trainer(net.collect_params(), 'sgd', target_dtype='int8')
    with pytest.raises(ValueError, match='loss_scaler'):
        Trainer(net.collect_params(), 'sgd', loss_scaler='sometimes')


# ---------------------------------------------------------------------------- float32 behaviour
@pytest.mark.parametrize('optimizer, opt_params', OPTIMIZERS)
def test_without_scaling_and_low_precision_matches_gluon_trainer_bit_for_bit(optimizer,
                                                                           opt_params):
    ref, net = mlp('a_'), mlp('b_')
    ref_trainer = gluon.Trainer(ref.collect_params(), optimizer, dict(opt_params))
    trainer = Trainer(net.collect_params(), optimizer, dict(opt_params))
    assert not trainer.loss_scaler.enabled
    data = batches(4)
    train(ref, ref_trainer, data)
    assert train(net, trainer, data) == [True] * 4
    for a, b in zip(snapshot(ref), snapshot(net)):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(snapshot(net)[1], snapshot(mlp('c_'))[1])   # training moved them


@pytest.mark.parametrize('scaler', [StaticLossScaler(1024.), StaticLossScaler(1000.),
                                    DynamicLossScaler()])
def test_scaled_step_gives_the_weights_of_unscaled_gluon_training(scaler):
    ref, net = mlp('a_'), mlp('b_')
    opt = {'learning_rate': .1, 'momentum': .9, 'rescale_grad': .5}
    ref_trainer = gluon.Trainer(ref.collect_params(), 'sgd', dict(opt))
    trainer = Trainer(net.collect_params(), 'sgd', dict(opt), loss_scaler=scaler)
    data = batches(4)
    train(ref, ref_trainer, data)
    assert train(net, trainer, data) == [True] * 4
    assert trainer.optimizer.rescale_grad == pytest.approx(.5 / (scaler.scale * 6))
    for a, b in zip(snapshot(ref), snapshot(net)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_gradients_are_multiplied_by_the_loss_scale():
    ref, net = mlp('a_'), mlp('b_')
    trainer = Trainer(net.collect_params(), 'sgd', loss_scaler=256)
    x, y = batches(1)[0]
    backward(ref, gluon.Trainer(ref.collect_params(), 'sgd'), x, y)
    backward(net, trainer, x, y)
    for p_ref, p in zip(params_of(ref), params_of(net)):
        np.testing.assert_allclose(p.grad().asnumpy(), 256 * p_ref.grad().asnumpy(), rtol=1e-6)


def test_scale_loss_yields_scaled_arrays_and_lists():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd', loss_scaler=8)
    loss = nd.array([1.5, -2.])
    with autograd.record():
        with trainer.scale_loss(loss) as scaled:
            np.testing.assert_array_equal(scaled.asnumpy(), [12., -16.])
        with trainer.scale_loss([loss, loss * 2]) as scaled:
            assert isinstance(scaled, list)
            np.testing.assert_array_equal(scaled[1].asnumpy(), [24., -32.])


def test_scale_loss_is_a_no_op_without_scaling():
    trainer = Trainer(mlp('a_').collect_params(), 'sgd', loss_scaler='none')
    loss = nd.array([3.])
    with trainer.scale_loss(loss) as scaled:   # no record scope needed: nothing happens
        assert scaled is loss


def test_scale_loss_outside_autograd_record_raises():
    trainer = Trainer(mlp('a_').collect_params(), 'sgd', loss_scaler='dynamic')
    with pytest.raises(RuntimeError, match='autograd.record'):
        with trainer.scale_loss(nd.array([1.])):
            pass


# ---------------------------------------------------------------------------- unscale
def test_unscale_divides_gradients_and_step_then_matches_a_plain_step():
    a, b = mlp('a_'), mlp('b_')
    opt = ('sgd', {'learning_rate': .05, 'momentum': .9})
    ta = Trainer(a.collect_params(), *opt, loss_scaler=1000)
    tb = Trainer(b.collect_params(), *opt, loss_scaler=1000)
    ref = mlp('r_')
    ref_trainer = gluon.Trainer(ref.collect_params(), *opt)
    for x, y in batches(3):
        backward(a, ta, x, y)
        backward(b, tb, x, y)
        backward(ref, ref_trainer, x, y)
        tb.unscale()
        for p, p_ref in zip(params_of(b), params_of(ref)):
            np.testing.assert_allclose(p.grad().asnumpy(), p_ref.grad().asnumpy(), rtol=1e-5,
                                       atol=1e-6)
        assert ta.step(6) and tb.step(6)
        ref_trainer.step(6)
        assert tb.optimizer.rescale_grad == pytest.approx(1 / 6)
    for wa, wb in zip(snapshot(a), snapshot(b)):
        np.testing.assert_allclose(wb, wa, rtol=1e-5, atol=1e-7)


def test_unscale_twice_in_one_step_raises_and_is_allowed_again_after_step():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd', loss_scaler='dynamic')
    x, y = batches(1)[0]
    backward(net, trainer, x, y)
    trainer.unscale()
    with pytest.raises(RuntimeError, match='already called.*once per step'):
        trainer.unscale()
    trainer.step(6)
    backward(net, trainer, x, y)
    trainer.unscale()   # a new step: allowed


def test_unscale_is_a_no_op_without_scaling():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd')
    x, y = batches(1)[0]
    backward(net, trainer, x, y)
    before = [p.grad().asnumpy() for p in params_of(net)]
    trainer.unscale()
    trainer.unscale()
    for g, p in zip(before, params_of(net)):
        np.testing.assert_array_equal(g, p.grad().asnumpy())


def test_split_step_with_unscale_and_clipping_matches_step():
    a, b = mlp('a_'), mlp('b_')
    opt = ('sgd', {'learning_rate': .05})
    ta = Trainer(a.collect_params(), *opt, loss_scaler=64)
    tb = Trainer(b.collect_params(), *opt, loss_scaler=64)
    x, y = batches(1)[0]
    backward(a, ta, x, y)
    backward(b, tb, x, y)
    tb.allreduce_grads()
    tb.unscale()
    gluon.utils.clip_global_norm([p.grad() for p in params_of(b)], 1e6)   # no-op clip
    assert ta.step(6) and tb.update(6)
    for wa, wb in zip(snapshot(a), snapshot(b)):
        np.testing.assert_allclose(wb, wa, rtol=1e-6)


# ---------------------------------------------------------------------------- overflow
@pytest.mark.parametrize('bad', [np.inf, np.nan])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_overflow_skips_the_step_leaving_weights_and_optimizer_state_bit_identical(bad, dtype):
    net = cast_mlp('a_', dtype)
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': .05, 'momentum': .9},
                      loss_scaler=DynamicLossScaler(init_scale=2.**10))
    assert train(net, trainer, batches(2)) == [True, True]
    weights, state = snapshot(net), optimizer_state(trainer)
    lp = [p for p in params_of(net) if dtype != 'float32']
    masters = [f32(m) for p in lp for m in trainer.master_weights(p)]
    x, y = batches(1, seed=5)[0]
    backward(net, trainer, x, y)
    grad = params_of(net)[1].grad()
    grad[0, 0] = bad
    assert trainer.step(6) is False
    assert trainer.skipped_steps == 1
    assert trainer.loss_scale == 2.**9
    for a, b in zip(weights, snapshot(net)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(masters, [f32(m) for p in lp for m in trainer.master_weights(p)]):
        np.testing.assert_array_equal(a, b)
    assert_states_equal(state, optimizer_state(trainer))
    # the next finite step updates again
    backward(net, trainer, x, y)
    assert trainer.step(6) is True
    assert not np.array_equal(weights[1], snapshot(net)[1])


def test_a_skipped_step_consumes_the_gradients():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd', loss_scaler='dynamic')
    x, y = batches(1)[0]
    backward(net, trainer, x, y)
    params_of(net)[0].grad()[:] = np.inf
    assert not trainer.step(6)
    with pytest.raises(UserWarning, match='has not been updated by backward'):
        trainer.step(6)


@pytest.mark.parametrize('init_scale, applied', [(2.**24, False), (1., True)])
def test_a_loss_scale_too_large_for_the_loss_overflows_and_backs_off(init_scale, applied):
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': 1e-40},
                      loss_scaler=DynamicLossScaler(init_scale=init_scale))
    before = snapshot(net)
    x = batches(1)[0][0]
    with autograd.record():
        loss = (net(x) * 1e32).sum()   # gradients ~1e32: times 2**24 beyond float32's 3.4e38
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()
    assert trainer.step(6) is applied
    assert trainer.skipped_steps == (0 if applied else 1)
    assert trainer.loss_scale == (init_scale if applied else init_scale / 2)
    assert all(np.array_equal(a, b) for a, b in zip(before, snapshot(net))) is not applied


def test_static_scaler_does_not_check_for_overflow():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd', loss_scaler=4)
    x, y = batches(1)[0]
    backward(net, trainer, x, y)
    params_of(net)[0].grad()[:] = np.inf
    assert trainer.step(6) is True
    assert trainer.skipped_steps == 0 and trainer.loss_scale == 4.
    assert not np.isfinite(snapshot(net)[0]).all()


def test_scale_doubles_after_growth_interval_finite_steps():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': .01},
                      loss_scaler=DynamicLossScaler(init_scale=2.**8, growth_interval=3))
    train(net, trainer, batches(2))
    assert trainer.loss_scale == 2.**8 and trainer.loss_scaler.counter == 2
    train(net, trainer, batches(1))
    assert trainer.loss_scale == 2.**9 and trainer.loss_scaler.counter == 0
    assert isinstance(trainer.loss_scale, float)


def test_update_after_allreduce_honours_the_overflow_check():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd', loss_scaler='dynamic')
    before = snapshot(net)
    x, y = batches(1)[0]
    backward(net, trainer, x, y)
    trainer.allreduce_grads()
    params_of(net)[2].grad()[1] = np.nan
    assert trainer.update(6) is False
    assert trainer.skipped_steps == 1
    for a, b in zip(before, snapshot(net)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('kvstore', ['device', None])
def test_inf_on_one_of_two_devices_skips_the_step_on_both(kvstore):
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net = mlp('a_', ctx=ctxs)
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': .05, 'momentum': .9},
                      kvstore=kvstore, loss_scaler='dynamic')
    data = batches(2)
    assert train(net, trainer, data[:1], ctxs) == [True]
    before = snapshot(net)
    state = optimizer_state(trainer)
    x, y = data[1]
    backward(net, trainer, x, y, ctxs)
    params_of(net)[1].grad(ctxs[1])[0, 0] = np.inf   # only on the second device
    assert trainer.step(6) is False
    assert trainer.skipped_steps == 1 and trainer.loss_scale == 2.**15
    for a, b in zip(before, snapshot(net)):
        np.testing.assert_array_equal(a, b)
    assert_states_equal(state, optimizer_state(trainer))


def test_two_devices_with_finite_gradients_stay_identical_and_match_one_device():
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net2, net1 = mlp('a_', ctx=ctxs), mlp('b_')
    opt = ('sgd', {'learning_rate': .05, 'momentum': .9})
    t2 = Trainer(net2.collect_params(), *opt, loss_scaler='dynamic')
    t1 = Trainer(net1.collect_params(), *opt, loss_scaler='dynamic')
    data = batches(3)
    assert train(net2, t2, data, ctxs) == [True] * 3
    train(net1, t1, data)
    for p2, p1 in zip(params_of(net2), params_of(net1)):
        d0, d1 = p2.list_data()
        np.testing.assert_array_equal(d0.asnumpy(), d1.asnumpy())
        np.testing.assert_allclose(d0.asnumpy(), p1.data().asnumpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- master weights
def cast_linear(prefix, dtype='float32', seed=0, ctx=None):
    """One CastDense layer (4 -> 3), parameters cast to ``dtype``."""
    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(CastDense(3, 4))
    net.initialize(mx.init.Zero(), ctx=ctx or mx.cpu())
    set_random_params(net, seed)
    if dtype != 'float32':
        net.cast(LP_DTYPES[dtype])
    return net


@pytest.mark.parametrize('optimizer, opt_params', OPTIMIZERS)
@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_low_precision_parameters_follow_float32_master_weights(dtype, optimizer, opt_params):
    net = cast_linear('lp_', dtype)
    assert all(p.dtype == LP_DTYPES[dtype] for p in params_of(net))
    ref = cast_linear('ref_', 'float32')
    for p_ref, p in zip(params_of(ref), params_of(net)):   # start from the rounded values
        p_ref.set_data(nd.amp_cast(p.data(), dtype='float32'))
    # float16 gradients here are at most 8 * scale: 2**8 keeps them finite
    scaler = DynamicLossScaler(init_scale=2.**8) if dtype == 'float16' else None
    trainer = Trainer(net.collect_params(), optimizer, dict(opt_params), loss_scaler=scaler)
    ref_trainer = Trainer(ref.collect_params(), optimizer, dict(opt_params), loss_scaler=scaler)
    for x, c in linear_batches(5):
        linear_backward(net, trainer, x, c)
        linear_backward(ref, ref_trainer, x, c)
        assert trainer.step(4) and ref_trainer.step(4)
    for p, p_ref in zip(params_of(net), params_of(ref)):
        (master,) = trainer.master_weights(p)
        assert master.dtype == np.float32 and p.data().dtype == LP_DTYPES[dtype]
        # the Parameter is exactly the rounded master weight
        rounded = nd.amp_cast(master, dtype=LP_DTYPES[dtype])
        np.testing.assert_array_equal(f32(p.data()), f32(rounded))
        # ... which differs from the master by at most half a unit in the last place
        m, lp = master.asnumpy(), f32(p.data())
        half_ulp = 2.0 ** (np.floor(np.log2(np.abs(m))) - BITS[dtype])
        assert np.all(np.abs(m - lp) <= half_ulp)
        assert not np.array_equal(m, lp)   # the master keeps bits the Parameter cannot hold
        # the master weight is what float32 training computes, bit for bit: both runs see the
        # same gradients (exact small integers) and a power-of-two loss scale
        np.testing.assert_array_equal(m, p_ref.data().asnumpy())
    # optimizer state is float32 (it is created from the master weights)
    for state in trainer._updaters[0].states.values():
        flat = state if isinstance(state, (list, tuple)) else [state]
        assert all(s.dtype == np.float32 for s in flat if s is not None)


def test_each_device_keeps_its_own_master_weights_and_all_agree():
    ctxs = [mx.cpu(0), mx.cpu(1)]
    net2, net1 = cast_linear('a_', 'bfloat16', ctx=ctxs), cast_linear('b_', 'bfloat16')
    opt = ('sgd', {'learning_rate': .05, 'momentum': .9})
    t2 = Trainer(net2.collect_params(), *opt)
    t1 = Trainer(net1.collect_params(), *opt)
    for x, c in linear_batches(3):
        with autograd.record():
            losses = [(net2(xi) * ci).sum() for xi, ci in
                      zip(gluon.utils.split_and_load(x, ctxs), gluon.utils.split_and_load(c, ctxs))]
        autograd.backward(losses)
        linear_backward(net1, t1, x, c)
        assert t2.step(4) and t1.step(4)
    for p2, p1 in zip(params_of(net2), params_of(net1)):
        masters = t2.master_weights(p2)
        assert [m.context for m in masters] == ctxs
        np.testing.assert_array_equal(masters[0].asnumpy(), masters[1].asnumpy())
        np.testing.assert_array_equal(masters[0].asnumpy(), t1.master_weights(p1)[0].asnumpy())
        np.testing.assert_array_equal(f32(p2.data(ctxs[1])), f32(p1.data()))


def test_multi_precision_flag_is_accepted_for_bfloat16():
    net = cast_mlp('lp_', 'bfloat16')
    trainer = Trainer(net.collect_params(), 'sgd',
                      {'learning_rate': .05, 'momentum': .9, 'multi_precision': True})
    before = snapshot(net)
    for x, c in linear_batches(2):
        linear_backward(net, trainer, x, c)
        assert trainer.step(4)
    assert params_of(net)[0].data().dtype == bfloat16
    assert not np.array_equal(before[1], snapshot(net)[1])


def test_float16_gradient_overflow_backs_off_until_the_scaled_gradients_fit():
    net = cast_linear('lp_', 'float16')
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': .01})
    assert trainer.loss_scale == 2.**16
    data = linear_batches(12)
    # the largest unscaled gradient over the steps decides which scales overflow float16
    ref = cast_linear('ref_', 'float32')
    ref_trainer = Trainer(ref.collect_params(), 'sgd')
    largest = []
    for x, c in data:
        linear_backward(ref, ref_trainer, x, c)
        largest.append(max(np.abs(p.grad().asnumpy()).max() for p in params_of(ref)))
    expected_scale, expected_skips = 2.**16, 0
    for g in largest:
        if g * expected_scale > 65504:   # float16's largest finite number
            expected_scale, expected_skips = expected_scale / 2, expected_skips + 1
    assert expected_skips >= 3
    before = snapshot(net)
    results = []
    for x, c in data:
        linear_backward(net, trainer, x, c)
        results.append(trainer.step(4))
    assert trainer.skipped_steps == expected_skips == results.count(False)
    assert trainer.loss_scale == expected_scale
    assert results[-1] is True
    assert np.isfinite(snapshot(net)[1]).all() and not np.array_equal(before[1], snapshot(net)[1])


def test_master_weights_of_a_float32_parameter_raise():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd')
    with pytest.raises(ValueError, match='no master weights'):
        trainer.master_weights(params_of(net)[0])
    with pytest.raises(ValueError, match='no Parameter named'):
        trainer.master_weights('nope')


def test_reset_master_weights_picks_up_new_parameter_values():
    net = cast_mlp('lp_', 'bfloat16')
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': .05})
    x, c = linear_batches(1)[0]
    linear_backward(net, trainer, x, c)
    trainer.step(4)
    weight = params_of(net)[1]
    weight.set_data(nd.amp_cast(nd.ones(weight.shape) * 3, dtype=bfloat16))
    np.testing.assert_array_equal(f32(trainer.master_weights(weight)[0]), 3)   # followed
    weight.data()[:] = nd.amp_cast(nd.ones(weight.shape) * 2, dtype=bfloat16)  # not set_data
    np.testing.assert_array_equal(f32(trainer.master_weights(weight)[0]), 3)   # stale
    trainer.reset_master_weights()
    np.testing.assert_array_equal(f32(trainer.master_weights(weight)[0]), 2)


def test_stale_gradient_raises_like_gluon_unless_ignored():
    net = mlp('a_')
    trainer = Trainer(net.collect_params(), 'sgd')
    x, y = batches(1)[0]
    backward(net, trainer, x, y)
    trainer.step(6)
    with pytest.raises(UserWarning, match='stale|not been updated'):
        trainer.step(6)
    assert trainer.step(6, ignore_stale_grad=True) is True


@pytest.mark.parametrize('batch_size', [0, -3, 'eight'])
def test_invalid_batch_size_raises(batch_size):
    trainer = Trainer(mlp('a_').collect_params(), 'sgd')
    with pytest.raises(ValueError, match='batch_size'):
        trainer.step(batch_size)


def copy_params(src, dst):
    for a, b in zip(params_of(src), params_of(dst)):
        b.set_data(a.data())


def test_save_and_load_states_restore_everything_exactly(tmp_path):
    net, trainer = trained_bf16_trainer('lp_')
    assert trainer.skipped_steps == 1 and trainer.loss_scaler.counter == 2
    fname = str(tmp_path / 'trainer.states')
    trainer.save_states(fname)
    assert os.listdir(tmp_path) == ['trainer.states']   # no temporary file left behind

    net2 = cast_mlp('lp_', 'bfloat16', seed=9)
    copy_params(net, net2)
    trainer2 = Trainer(net2.collect_params(), 'sgd', {'learning_rate': .05, 'momentum': .9},
                       loss_scaler=DynamicLossScaler(init_scale=2.**6, growth_interval=4))
    trainer2.load_states(fname)
    assert trainer2.loss_scaler == trainer.loss_scaler
    assert trainer2.skipped_steps == 1
    for p, p2 in zip(params_of(net), params_of(net2)):
        np.testing.assert_array_equal(trainer.master_weights(p)[0].asnumpy(),
                                      trainer2.master_weights(p2)[0].asnumpy())
    # masters hold more than the bfloat16 parameters: a reload from them is not a re-rounding
    assert not np.array_equal(trainer2.master_weights(params_of(net2)[1])[0].asnumpy(),
                              f32(params_of(net2)[1].data()))
    assert_states_equal(optimizer_state(trainer), optimizer_state(trainer2))
    # and training continues identically
    for x, c in linear_batches(2, seed=11):
        linear_backward(net, trainer, x, c)
        linear_backward(net2, trainer2, x, c)
        assert trainer.step(4) and trainer2.step(4)
    for a, b in zip(snapshot(net), snapshot(net2)):
        np.testing.assert_array_equal(a, b)
    assert trainer2.loss_scale == trainer.loss_scale


def test_save_states_replaces_the_file_atomically(tmp_path, monkeypatch):
    net, trainer = trained_bf16_trainer('lp_', steps=1, skip=False)
    fname = tmp_path / 'trainer.states'
    fname.write_bytes(b'previous checkpoint')

    def broken_fsync(fd):
        raise OSError('disk full')
    monkeypatch.setattr(os, 'fsync', broken_fsync)
    with pytest.raises(OSError, match='disk full'):
        trainer.save_states(str(fname))
    assert fname.read_bytes() == b'previous checkpoint'
    assert os.listdir(tmp_path) == ['trainer.states']
    monkeypatch.undo()
    trainer.save_states(str(fname))
    assert fname.read_bytes() != b'previous checkpoint'


@pytest.fixture
def saved(tmp_path):
    net, trainer = trained_bf16_trainer('lp_')
    fname = tmp_path / 'trainer.states'
    trainer.save_states(str(fname))
    return net, trainer, fname


def assert_untouched(trainer, net):
    assert trainer.skipped_steps == 0
    assert trainer.loss_scaler == DynamicLossScaler(init_scale=2.**6, growth_interval=4)
    assert not trainer._updaters[0].states
    np.testing.assert_array_equal(f32(trainer.master_weights(params_of(net)[1])[0]),
                                  f32(params_of(net)[1].data()))


@pytest.mark.parametrize('damage, message', [
    (lambda b: b[:len(b) // 2], 'truncated'),
    (lambda b: b[:10], 'bad header'),
    (lambda b: b[:-1] + bytes([b[-1] ^ 0xFF]), 'corrupt'),
    (lambda b: b + b'extra', 'trailing'),
    (lambda b: b'garbage' * 10, 'bad header'),
    (lambda b: b'', 'bad header'),
])
def test_damaged_states_file_raises_and_loads_nothing(saved, damage, message):
    _, _, fname = saved
    fname.write_bytes(damage(fname.read_bytes()))
    net, trainer = fresh_trainer()
    with pytest.raises(ValueError, match=message):
        trainer.load_states(str(fname))
    assert_untouched(trainer, net)


def test_gluon_states_file_is_recognised_and_refused(tmp_path):
    net = mlp('a_')
    gt = gluon.Trainer(net.collect_params(), 'sgd')
    fname = str(tmp_path / 'gluon.states')
    gt.save_states(fname)
    trainer = Trainer(net.collect_params(), 'sgd')
    with pytest.raises(ValueError, match='not an mxmp Trainer states file.*gluon'):
        trainer.load_states(fname)


def test_states_of_other_parameter_names_raise_unless_names_are_not_checked(saved):
    _, _, fname = saved
    net, trainer = fresh_trainer('other_')
    with pytest.raises(ValueError, match="'lp_.*'other_"):
        trainer.load_states(str(fname))
    assert_untouched(trainer, net)
    trainer.load_states(str(fname), check_names=False)
    assert trainer.skipped_steps == 1


def test_states_of_other_shapes_raise(saved):
    _, _, fname = saved
    net = nn.HybridSequential(prefix='lp_')
    with net.name_scope():
        net.add(CastDense(6, 4), CastDense(3, 6))
    net.initialize()
    net.cast(bfloat16)
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': .05, 'momentum': .9},
                      loss_scaler=DynamicLossScaler(init_scale=2.**6, growth_interval=4))
    with pytest.raises(ValueError, match=r'shape \(5,\) in the file but \(6,\)'):
        trainer.load_states(str(fname))
    assert trainer.skipped_steps == 0


def test_states_of_another_parameter_count_or_dtype_raise(saved):
    _, _, fname = saved
    net = nn.HybridSequential(prefix='lp_')
    with net.name_scope():
        net.add(CastDense(5, 4))
    net.initialize()
    trainer = Trainer(net.collect_params(), 'sgd')
    with pytest.raises(ValueError, match='4 Parameters but this Trainer has 2'):
        trainer.load_states(str(fname))
    f32_net = cast_mlp('lp_', 'float32')
    trainer = Trainer(f32_net.collect_params(), 'sgd',
                      loss_scaler=DynamicLossScaler(init_scale=2.**6, growth_interval=4))
    with pytest.raises(ValueError, match='bfloat16 in the file but float32 here'):
        trainer.load_states(str(fname))


def test_states_of_another_loss_scaler_raise_and_load_nothing(saved):
    _, _, fname = saved
    net, trainer = fresh_trainer(loss_scaler=DynamicLossScaler(init_scale=2.**6,
                                                               growth_interval=5))
    with pytest.raises(ValueError, match='growth_interval'):
        trainer.load_states(str(fname))
    assert trainer.skipped_steps == 0 and not trainer._updaters[0].states


def test_policy_gives_target_dtype_and_default_scaler_and_contradictions_raise():
    import mxmp
    net = nn.Dense(2, in_units=3)
    net.initialize()
    params = net.collect_params()
    t = Trainer(params, 'sgd', policy=mxmp.Policy('float16'), target_dtype='float16')
    assert t.target_dtype == 'float16' and t.loss_scaler.dynamic
    with pytest.raises(ValueError, match="target_dtype='bfloat16'.*'float16'"):
        Trainer(params, 'sgd', policy=mxmp.Policy('float16'), target_dtype='bfloat16')
    with pytest.raises(TypeError, match='mxmp.Policy'):
        Trainer(params, 'sgd', policy='float16')
