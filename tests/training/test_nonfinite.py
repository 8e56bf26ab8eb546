"""Non-finite handling: injected inf/NaN never reach weights or optimizer states; a loss scale
stuck at its floor raises naming the parameters; a NaN in the forward pass is reported as such.

Injections are drawn from a seeded RNG: at random steps an inf or NaN goes into the loss of one
of two devices (a NaN in the forward pass), into one element of one gradient on one device, or
nowhere. Two contexts ``[mx.cpu(0), mx.cpu(1)]``; parameters stored in float16 or bfloat16 with
float32 master weights (mxmp.Trainer) or in the target dtype with ``cast_params`` (mxmp.Module).
"""
import warnings

import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.scaling import DynamicLossScaler
from mxmp._src.training.trainer import Trainer
from mxmp._src.errors import LossScaleAtFloorError, NonFiniteForwardWarning

from helpers import f32, optimizer_state
import helpers as tm
from helpers import CTXS, floor_trainer, nan_grad_step, params, two_layer  # noqa: E402

STEPS = 14


def everything(net, trainer):
    """Weights on every device, master weights on every device, optimizer states and counts."""
    weights = [f32(d) for p in params(net) for d in p.list_data()]
    masters = [m.asnumpy() for p in params(net) for m in trainer.master_weights(p)]
    return weights, masters, optimizer_state(trainer)


def assert_same(before, after):
    (w0, m0, (s0, c0, n0)), (w1, m1, (s1, c1, n1)) = before, after
    for a, b in zip(w0 + m0 + s0, w1 + m1 + s1):
        np.testing.assert_array_equal(a, b)
    assert len(s0) == len(s1) and (c0, n0) == (c1, n1)


def draw_injections(seed, steps=STEPS, n_params=4):
    """Per step: None, ('loss', device, value) or ('grad', param, device, value)."""
    rng = np.random.RandomState(seed)
    plan = []
    for _ in range(steps):
        kind = rng.choice(['none', 'none', 'loss', 'grad'])
        value = rng.choice([np.inf, -np.inf, np.nan])
        if kind == 'loss':
            plan.append(('loss', rng.randint(2), value))
        elif kind == 'grad':
            plan.append(('grad', rng.randint(n_params), rng.randint(2), value))
        else:
            plan.append(None)
    return plan


@pytest.mark.parametrize('dtype, seed', [('float16', 0), ('bfloat16', 1)])
def test_injected_inf_nan_in_loss_or_one_gradient_on_one_device_changes_nothing(dtype, seed):
    net = two_layer(dtype)
    trainer = Trainer(net.collect_params(), 'adam', {'learning_rate': .01, 'wd': 1e-3},
                      loss_scaler=DynamicLossScaler(init_scale=2.0 ** 12, growth_interval=3))
    rng = np.random.RandomState(100 + seed)
    plan = draw_injections(seed)
    assert {p[0] for p in plan if p} == {'loss', 'grad'} and None in plan
    applied_steps = 0
    for inject in plan:
        x, y = nd.array(rng.randn(8, 4)), nd.array(rng.randn(8, 3))
        xs, ys = gluon.utils.split_and_load(x, CTXS), gluon.utils.split_and_load(y, CTXS)
        before = everything(net, trainer)
        scale, skipped = trainer.loss_scale, trainer.skipped_steps
        with autograd.record():
            losses = [((net(xi) - yi) ** 2).mean() for xi, yi in zip(xs, ys)]
            if inject and inject[0] == 'loss':
                losses[inject[1]] = losses[inject[1]] * float(inject[2])
            with trainer.scale_loss(losses) as scaled:
                autograd.backward(scaled)
        if inject and inject[0] == 'grad':
            _, k, dev, value = inject
            params(net)[k].grad(CTXS[dev])[0] = value
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            applied = trainer.step(8)
        forward_warnings = [w for w in caught if issubclass(w.category, NonFiniteForwardWarning)]
        if inject is None:
            assert applied is True and not forward_warnings
            applied_steps += 1
            continue
        assert applied is False
        assert trainer.skipped_steps == skipped + 1 and trainer.loss_scale == scale / 2
        assert_same(before, everything(net, trainer))
        # a NaN/inf loss is reported as a forward-pass problem; a gradient one is not
        assert len(forward_warnings) == (1 if inject[0] == 'loss' else 0)
    assert applied_steps == plan.count(None)
    for p in params(net):   # both devices still agree after the skipped steps
        a, b = p.list_data()
        np.testing.assert_array_equal(f32(a), f32(b))


def test_injected_inf_nan_in_the_module_on_one_of_two_contexts_changes_nothing():
    x, y = tm.problem(STEPS * tm.MODULE_BATCH, seed=3)
    mod = tm.ready(mxmp.Module(tm.mlp(), context=CTXS, cast_params=True,
                               loss_scaler=DynamicLossScaler(init_scale=2.0 ** 12,
                                                             growth_interval=3),
                               **tm.bf16(target_dtype='float16')))
    plan = draw_injections(5)
    assert {p[0] for p in plan if p} == {'loss', 'grad'}
    group = mod._exec_group
    for s, inject in enumerate(plan):
        xb, yb = x[s * tm.MODULE_BATCH:(s + 1) * tm.MODULE_BATCH].copy(), y[s * tm.MODULE_BATCH:(s + 1) * tm.MODULE_BATCH]
        if inject and inject[0] == 'loss':       # one sample on the chosen context
            # +inf: relu(NaN) is 0 in MXNet, so an input NaN can vanish from the forward
            # pass (finite outputs, NaN weight gradient: a gradient overflow, not a forward one)
            xb[(inject[1] + 1) * tm.MODULE_BATCH // 2 - 1, 0] = np.inf
        before = (tm.np_params(mod), tm.device_params(mod), tm.module_optimizer_state(mod))
        scale = mod.loss_scale
        mod.forward_backward(tm.batch_of(xb, yb))
        if inject and inject[0] == 'grad':
            _, k, dev, value = inject
            group.grad_arrays[k][dev][0] = value
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            applied = mod.update()
        forward_warnings = [w for w in caught if issubclass(w.category, NonFiniteForwardWarning)]
        if inject is None:
            assert applied is True and not forward_warnings
            continue
        assert applied is False and mod.loss_scale == scale / 2
        assert len(forward_warnings) == (1 if inject[0] == 'loss' else 0)
        after = (tm.np_params(mod), tm.device_params(mod), tm.module_optimizer_state(mod))
        for name, value in before[0].items():
            np.testing.assert_array_equal(after[0][name], value)
        for key, value in before[1].items():
            np.testing.assert_array_equal(after[1][key], value)
        (s0, c0, n0), (s1, c1, n1) = before[2], after[2]
        assert (c0, n0) == (c1, n1) and s0.keys() == s1.keys()
        for idx, value in s0.items():
            np.testing.assert_array_equal(s1[idx], value)
    assert mod.skipped_steps == sum(1 for p in plan if p)


def test_scale_stuck_at_its_floor_for_k_overflows_raises_naming_the_parameters():
    net, trainer = floor_trainer(3)
    # 4 -> 2 -> 1 (two overflows above the floor), then three overflows at the floor
    assert [nan_grad_step(net, trainer) for _ in range(4)] == [False] * 4
    assert trainer.loss_scale == 1.0 and trainer.loss_scaler.overflows_at_floor == 2
    before = everything(net, trainer)
    with pytest.raises(LossScaleAtFloorError,
                       match=r"floor \(min_scale=1\) for 3 consecutive.*floor_castdense1_weight") \
            as info:
        nan_grad_step(net, trainer)
    assert info.value.parameters == ['floor_castdense1_weight']
    assert info.value.forward_nonfinite is False
    assert_same(before, everything(net, trainer))


def test_a_finite_step_resets_the_count_of_overflows_at_the_floor():
    net, trainer = floor_trainer(3)
    for _ in range(4):
        nan_grad_step(net, trainer)
    assert nan_grad_step(net, trainer, where=None) is True
    assert trainer.loss_scaler.overflows_at_floor == 0
    for _ in range(2):
        assert nan_grad_step(net, trainer) is False     # 2 < 3: no error yet


def test_max_overflows_at_floor_zero_skips_forever_like_pytorch():
    net, trainer = floor_trainer(0)
    assert [nan_grad_step(net, trainer) for _ in range(25)] == [False] * 25
    assert trainer.loss_scaler.overflows_at_floor == 23


def test_stuck_at_floor_with_a_nan_loss_says_the_forward_pass_was_not_finite():
    net, trainer = floor_trainer(1)
    with pytest.warns(NonFiniteForwardWarning, match='not an overflow from loss scaling'):
        for _ in range(2):
            nan_grad_step(net, trainer, where='loss')
    with pytest.warns(NonFiniteForwardWarning), \
            pytest.raises(LossScaleAtFloorError, match='forward pass itself was not finite'):
        nan_grad_step(net, trainer, where='loss')


def test_module_stuck_at_its_floor_raises_naming_the_parameters():
    x, y = tm.problem(tm.MODULE_BATCH)
    mod = tm.ready(mxmp.Module(tm.mlp(), loss_scaler=DynamicLossScaler(
        init_scale=2.0, max_overflows_at_floor=2), **tm.bf16()))
    for expected in (False, False):
        mod.forward_backward(tm.batch_of(x, y))
        mod._exec_group.grad_arrays[0][0][0] = np.inf     # fc1_weight
        assert mod.update() is expected
    mod.forward_backward(tm.batch_of(x, y))
    mod._exec_group.grad_arrays[0][0][0] = np.inf
    with pytest.raises(LossScaleAtFloorError, match='fc1_weight'):
        mod.update()


def test_scaler_counts_overflows_at_the_floor_and_saves_the_count():
    s = DynamicLossScaler(init_scale=2.0, max_overflows_at_floor=5)
    s = s.adjust(False)                     # 2 -> 1: not yet at the floor
    assert (s.scale, s.overflows_at_floor) == (1.0, 0)
    s = s.adjust(False).adjust(False)
    assert s.overflows_at_floor == 2 and not s.stuck_at_floor
    back = DynamicLossScaler(init_scale=2.0, max_overflows_at_floor=5).load_state_dict(
        s.state_dict())
    assert back == s
    assert s.adjust(True).overflows_at_floor == 0
    assert DynamicLossScaler().max_overflows_at_floor == 10


def test_scaler_state_without_every_field_is_refused_naming_the_missing_key():
    state = DynamicLossScaler(scale=1024.0, counter=3).state_dict()
    del state['overflows_at_floor']
    with pytest.raises(ValueError, match="misses the key 'overflows_at_floor'"):
        DynamicLossScaler().load_state_dict(state)


@pytest.mark.parametrize('value', [-1, 1.5, True])
def test_max_overflows_at_floor_must_be_a_non_negative_integer(value):
    with pytest.raises(ValueError, match='max_overflows_at_floor'):
        DynamicLossScaler(max_overflows_at_floor=value)
