"""The one training step (mxmp._src.training.step) and the pieces laid out around it ."""
import pathlib
import re

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd

from mxmp._src.distributed import KVStoreExchange, broadcast_from_root, bytes_per_step
from mxmp._src.dtypes import dtype_name, mx_dtype
from mxmp._src.scaling import (DynamicLossScaler, NoOpLossScaler, StaticLossScaler,
    from_state_dict)
from mxmp._src.errors import LossScaleAtFloorError
from mxmp._src.training.step import Stage, Step, device_update

MXMP = pathlib.Path(__file__).resolve().parents[2] / 'mxmp'


def test_multi_all_finite_is_called_in_one_module_only():
    callers = sorted(str(p.relative_to(MXMP)) for p in MXMP.rglob('*.py')
                     if re.search(r'\bmulti_all_finite\(', p.read_text()))
    assert callers == ['_src/training/step.py']


@pytest.mark.parametrize('scaler', [NoOpLossScaler(), StaticLossScaler(8.0),
                                    DynamicLossScaler(init_scale=4.0, counter=3,
                                                      overflows_at_floor=0)])
def test_from_state_dict_rebuilds_class_configuration_and_state(scaler):
    assert from_state_dict(scaler.state_dict()) == scaler


@pytest.mark.parametrize('state, match', [({'class': 'Foo'}, 'unknown loss scaler state'),
                                          (None, 'unknown loss scaler state'),
                                          ({'class': 'StaticLossScaler', 'scale': -1.0},
                                           'invalid loss scaler state: scale')])
def test_from_state_dict_refuses_bad_states(state, match):
    with pytest.raises(ValueError, match=match):
        from_state_dict(state)


def _sgd_call(weight, grad):
    opt = mx.optimizer.SGD(learning_rate=1.0)
    return opt, [(mx.optimizer.get_updater(opt), device_update([(0, weight, grad, None)]))]


def test_unscale_twice_raises_and_the_step_then_leaves_the_scale_out():
    step = Step(StaticLossScaler(4.0))
    grad = nd.array([8.0, -4.0])
    step.unscale([grad])
    assert step.stage is Stage.UNSCALED and grad.asnumpy().tolist() == [2.0, -1.0]
    with pytest.raises(RuntimeError, match='unscale\\(\\) was already called'):
        step.unscale([grad])
    weight = nd.array([1.0, 1.0])
    opt, calls = _sgd_call(weight, grad)
    assert step.apply(calls, opt, 1.0) is True
    assert opt.rescale_grad == 1.0 and weight.asnumpy().tolist() == [-1.0, 2.0]
    assert step.stage is Stage.READY


def test_apply_skips_on_overflow_backs_off_and_counts():
    step = Step(DynamicLossScaler(init_scale=8.0))
    weight = nd.array([1.0, 1.0])
    opt, calls = _sgd_call(weight, nd.array([np.inf, 1.0]))
    assert step.apply(calls, opt, 0.5) is False
    assert (step.skipped_steps, step.scaler.scale) == (1, 4.0)
    assert weight.asnumpy().tolist() == [1.0, 1.0]
    opt, calls = _sgd_call(weight, nd.array([4.0, 8.0]))
    assert step.apply(calls, opt, 0.5) is True
    assert opt.rescale_grad == 0.5 / 4.0 and weight.asnumpy().tolist() == [0.5, 0.0]


def test_a_step_alone_backs_off_its_own_scaler():
    weight = nd.array([1.0])
    opt, calls = _sgd_call(weight, nd.array([np.nan]))
    step = Step(DynamicLossScaler(init_scale=2.0))
    applied, scaler = step.apply(calls, opt, 1.0), step.scaler
    assert applied is False and scaler.scale == 1.0


def test_the_loss_scale_at_floor_error_is_a_skipped_step_and_the_step_is_ready_again():
    step = Step(DynamicLossScaler(init_scale=1.0, max_overflows_at_floor=1))
    weight = nd.array([1.0])
    step.unscale([nd.array([np.inf])])
    opt, calls = _sgd_call(weight, nd.array([np.inf]))
    with pytest.raises(LossScaleAtFloorError):
        step.apply(calls, opt, 1.0)
    assert step.stage is Stage.READY and step.skipped_steps == 1
    assert weight.asnumpy().tolist() == [1.0]     # nothing was updated
    grad = nd.array([2.0])
    step.unscale([grad])                     # the next iteration: no "already called"
    opt, calls = _sgd_call(weight, grad)
    assert step.apply(calls, opt, 1.0) is True
    assert weight.asnumpy().tolist() == [-1.0]


def test_broadcast_from_root_sends_a_float32_copy_of_bfloat16_and_writes_every_device():
    arrays = [nd.array([1.5, -2.0]).astype(mx_dtype('bfloat16')) for _ in range(2)]
    sent = []

    def send(key, wire):
        sent.append((key, dtype_name(wire.dtype)))
        wire[:] = nd.array([3.0, 4.0], dtype=wire.dtype)
    assert broadcast_from_root([('w', arrays)], send, 'horovod') == ['w']
    assert sent == [('w', 'float32')]
    for arr in arrays:
        assert dtype_name(arr.dtype) == 'bfloat16'
        assert nd.amp_cast(arr, dtype='float32').asnumpy().tolist() == [3.0, 4.0]


def test_cast_buffers_round_trip_and_byte_count():
    grads = [nd.array([1.0, 2.0, 3.0])]
    bufs = KVStoreExchange(1, None)
    with autograd.pause():
        out = bufs.cast_in(0, grads, 'float16')
        assert dtype_name(out[0].dtype) == 'float16'
        out[0][:] = out[0] * 2
        bufs.cast_out(out, grads)
    assert grads[0].asnumpy().tolist() == [2.0, 4.0, 6.0]
    assert bufs.cast_in(0, grads, 'float32') is grads

    class P:
        def __init__(self, shape, grad_req='write'):
            self.shape, self.grad_req = shape, grad_req
    params = [P((3, 4)), P((5,)), P((7,), 'null')]
    assert bytes_per_step(params, lambda p: 'bfloat16') == 2 * 17
