"""PyTorch GradScaler habits: one loss scaler shared by several Trainers; nested loss lists.

Semantics under test (mxmp._src.scaling.LossScaleGroup, after torch/amp/grad_scaler.py): Trainers
given the same LossScaleGroup use one scale; each skips only its own update when its gradients
overflow; the scale changes once per iteration, after every Trainer of the group stepped.
"""
import gc

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.scaling import DynamicLossScaler, LossScaleGroup, flatten_losses


def dense(seed):
    mx.random.seed(seed)
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize(mx.init.Normal(0.5))
    return net


def x():
    return nd.array(np.arange(6, dtype=np.float32).reshape(2, 3) / 6)


def backward(net, trainer, inf=False):
    with autograd.record():
        loss = net(x()).square().sum()
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()
    if inf:
        net.weight.grad()[0, 0] = np.inf


def pair(scaler, scaler2=None):
    """Two Trainers: sharing one LossScaleGroup of ``scaler``, or with a scaler each."""
    nets = dense(0), dense(1)
    group = LossScaleGroup(scaler) if scaler2 is None else None
    trainers = [mxmp.Trainer(n.collect_params(), 'sgd', {'learning_rate': 0.1},
                             loss_scaler=s)
                for n, s in zip(nets, (group or scaler, group or scaler2))]
    return nets, trainers


def weights(net):
    return net.weight.data().asnumpy().copy()


def test_shared_scale_is_updated_once_per_iteration():
    scaler = DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=2)
    nets, (t0, t1) = pair(scaler)
    scales = []
    for _ in range(4):                      # four finite iterations: two growth intervals
        for net, t in zip(nets, (t0, t1)):
            backward(net, t)
        assert t0.step(2)
        assert t0.loss_scale == t1.loss_scale    # no change between the two steps
        assert t1.step(2)
        scales.append((t0.loss_scale, t1.loss_scale))
    # one count per iteration (not per Trainer): x2 after iterations 2 and 4
    assert scales == [(1024.0, 1024.0), (2048.0, 2048.0), (2048.0, 2048.0), (4096.0, 4096.0)]
    assert t0.loss_scaler is t1.loss_scaler


def test_unshared_scalers_drift_apart_as_before():
    nets, (t0, t1) = pair(DynamicLossScaler(init_scale=2.0 ** 10),
                          DynamicLossScaler(init_scale=2.0 ** 10))
    backward(nets[0], t0)
    backward(nets[1], t1, inf=True)
    assert t0.step(2) and not t1.step(2)
    assert (t0.loss_scale, t1.loss_scale) == (1024.0, 512.0)
    backward(nets[0], t0)
    assert t0.step(2)                    # a Trainer alone steps as often as it likes


def test_overflow_in_one_trainer_skips_only_its_step_and_lowers_the_scale_once():
    scaler = DynamicLossScaler(init_scale=2.0 ** 10)
    nets, (t0, t1) = pair(scaler)
    before = [weights(n) for n in nets]
    backward(nets[0], t0)
    backward(nets[1], t1, inf=True)
    assert t0.step(2) is True               # its own gradients were finite: applied
    assert t0.loss_scale == 1024.0          # the scale waits for the whole iteration
    assert t1.step(2) is False              # skipped, as PyTorch skips that optimizer only
    assert not np.array_equal(weights(nets[0]), before[0])
    np.testing.assert_array_equal(weights(nets[1]), before[1])
    assert (t0.loss_scale, t1.loss_scale) == (512.0, 512.0)
    assert (t0.skipped_steps, t1.skipped_steps) == (0, 1)

    # both overflow: still one backoff for the iteration
    for net, t in zip(nets, (t0, t1)):
        backward(net, t, inf=True)
    assert not t0.step(2) and not t1.step(2)
    assert (t0.loss_scale, t1.loss_scale) == (256.0, 256.0)


def test_the_loss_is_scaled_with_the_scale_the_step_divides_by():
    # after an overflowing iteration both Trainers scale and unscale with the new scale:
    # the update equals that of a float32 run without any scaling
    scaler = DynamicLossScaler(init_scale=2.0 ** 10)
    nets, (t0, t1) = pair(scaler)
    ref = dense(1)
    rt = mxmp.Trainer(ref.collect_params(), 'sgd', {'learning_rate': 0.1}, loss_scaler='none')
    backward(nets[0], t0, inf=True)
    backward(nets[1], t1)
    t0.step(2)
    t1.step(2)
    backward(ref, rt)
    rt.step(2)
    for net, t in zip(nets, (t0, t1)):
        backward(net, t)
    t0.step(2)
    t1.step(2)
    backward(ref, rt)
    rt.step(2)
    np.testing.assert_allclose(weights(nets[1]), weights(ref), rtol=1e-6)


def test_stepping_twice_before_the_others_names_the_fix():
    nets, (t0, t1) = pair(DynamicLossScaler())
    backward(nets[0], t0)
    t0.step(2)
    backward(nets[0], t0)
    with pytest.raises(RuntimeError, match='own loss scaler objects'):
        t0.step(2)
    with pytest.raises(RuntimeError, match='has already stepped'):
        t0.update(2)
    backward(nets[1], t1)
    assert t1.step(2)                        # the iteration completes
    assert t0.step(2, ignore_stale_grad=True)


def test_a_member_at_its_floor_raises_but_counts_as_stepped_so_the_others_step_on():
    # t1 overflows at the floor and raises; it has stepped (skipped) for the group, so in the
    # next iteration t0 steps again without "already stepped", whichever order they step in
    scaler = DynamicLossScaler(init_scale=1.0, min_scale=1.0, max_overflows_at_floor=1)
    nets, (t0, t1) = pair(scaler)
    before = weights(nets[1])
    backward(nets[0], t0)
    assert t0.step(2)
    backward(nets[1], t1, inf=True)
    with pytest.raises(mxmp.LossScaleAtFloorError, match='floor'):
        t1.step(2)
    np.testing.assert_array_equal(weights(nets[1]), before)
    assert (t0.skipped_steps, t1.skipped_steps) == (0, 1)
    for net, t in zip(nets, (t0, t1)):       # the next iteration: both step normally
        backward(net, t)
    assert t0.step(2) and t1.step(2)
    assert not np.array_equal(weights(nets[1]), before)
    assert t0.loss_scale == t1.loss_scale == 1.0


def test_a_new_run_with_the_same_scaler_object_starts_afresh():
    scaler = DynamicLossScaler(init_scale=2.0 ** 10)
    net = dense(0)
    t = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1}, loss_scaler=scaler)
    backward(net, t, inf=True)
    t.step(2)
    assert t.loss_scale == 512.0
    del t
    gc.collect()
    # the old Trainer is gone once the Parameters have a new one
    t2 = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1}, loss_scaler=scaler)
    gc.collect()
    assert t2.loss_scale == 1024.0
    for _ in range(2):
        backward(net, t2)
        assert t2.step(2)


def test_shared_scaler_state_is_saved_and_loaded(tmp_path):
    nets, (t0, t1) = pair(DynamicLossScaler(init_scale=2.0 ** 10))
    backward(nets[0], t0, inf=True)
    backward(nets[1], t1)
    t0.step(2)
    t1.step(2)
    t0.save_states(str(tmp_path / 't0.states'))
    nets2, (u0, u1) = pair(DynamicLossScaler(init_scale=2.0 ** 10))
    u0.load_states(str(tmp_path / 't0.states'), check_names=False)
    assert u0.loss_scale == u1.loss_scale == 512.0


def test_scale_loss_takes_nested_lists_and_tuples():
    net = dense(0)
    t = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                     loss_scaler=DynamicLossScaler(init_scale=8.0))
    with autograd.record():
        out = net(x())
        losses = [[out.sum(), out.mean()], (out.max(),)]
        with t.scale_loss(losses) as scaled:
            assert isinstance(scaled, list) and isinstance(scaled[0], list) \
                and isinstance(scaled[1], tuple)
            for got, want in zip(flatten_losses(scaled), flatten_losses(losses)):
                np.testing.assert_allclose(got.asnumpy(), 8 * want.asnumpy(), rtol=1e-6)
            autograd.backward(flatten_losses(scaled))
    assert t.step(2)
    with autograd.record():
        loss = net(x()).sum()
        with pytest.raises(TypeError, match=r'loss\[1\]\[0\] is a float'):
            with t.scale_loss([loss, [1.0]]):
                pass


def test_amp_scale_loss_takes_nested_lists_with_a_gluon_trainer():
    from mxmp import amp
    net = dense(0)
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    amp.init_trainer(trainer)
    with autograd.record():
        out = net(x())
        with amp.scale_loss([[out.sum()], [out.mean()]], trainer) as scaled:
            assert len(flatten_losses(scaled)) == 2
            scale = trainer._amp_loss_scaler.loss_scale      # float16 default: 2**16
            np.testing.assert_allclose(scaled[0][0].asnumpy(), scale * out.sum().asnumpy(),
                                       rtol=1e-6)
            assert scale == 2.0 ** 16
            autograd.backward(flatten_losses(scaled))
    trainer.step(2)


def test_a_scaler_value_given_to_two_trainers_is_not_shared():
    scaler = DynamicLossScaler(init_scale=2.0 ** 10)
    nets, (t0, t1) = pair(scaler, scaler)
    backward(nets[0], t0, inf=True)
    assert not t0.step(2)
    assert (t0.loss_scale, t1.loss_scale) == (512.0, 1024.0)
    backward(nets[0], t0)
    assert t0.step(2)                    # alone: steps as often as it likes
