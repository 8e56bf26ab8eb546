"""Unscaling (``Trainer.unscale``, ``amp.unscale``) and every other multiplication of a
float16/bfloat16 array by a Python number is exact for the dtype's range: MXNet converts the
number to the array's dtype (2**16 is inf in float16, so ``grad /= 2**16`` gave 0), mxmp
computes in float32 (``mxmp._src.scaling.multiply``/``divide``)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp import amp
from mxmp._src.dtypes import mx_dtype
from mxmp._src.scaling import StaticLossScaler, divide, multiply, scale_losses
from mxmp._src.training.step import Step

SCALES = [2.0 ** k for k in range(0, 25)]   # every power of two up to the cap, 2**24


def _f32(a):
    return nd.amp_cast(a, dtype='float32').asnumpy().astype(np.float64)


def _round(values, dtype):
    """float64 values rounded to ``dtype`` (MXNet's amp_cast: round to nearest even)."""
    return _f32(nd.amp_cast(nd.array(values, dtype='float64').astype('float32'),
                            dtype=mx_dtype(dtype)))


def _gradient(dtype, scale, seed=0, size=64):
    """A low-precision gradient as backward leaves it: true values (3e-4 .. 3e-8 and the
    float16 subnormals) times ``scale``, rounded; keeps only values finite at that scale."""
    rng = np.random.RandomState(seed)
    true = rng.choice([-1, 1], size) * 10 ** rng.uniform(-8, -3.5, size)
    return nd.amp_cast(nd.array(np.minimum(true * scale, 6e4)), dtype=mx_dtype(dtype))


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
@pytest.mark.parametrize('scale', SCALES)
def test_unscale_divides_low_precision_gradients_exactly_at_every_scale(dtype, scale):
    grad = _gradient(dtype, scale)
    want = _round(_f32(grad) / scale, dtype)   # the exact quotient, rounded once
    step = Step(StaticLossScaler(scale))
    step.unscale([grad])
    assert np.array_equal(_f32(grad), want)
    assert np.count_nonzero(want) > 32


def test_a_float16_trainer_with_the_default_scaler_unscales_to_the_true_gradient():
    """The issue's case: true gradient 3e-4 at scale 2**16 became 0.0, and step() returned
    True without moving the weights."""
    weight = gluon.Parameter('w', shape=(1024,), dtype='float16', init=mx.init.One())
    weight.initialize()
    trainer = mxmp.Trainer([weight], 'sgd', {'learning_rate': 1.0})
    assert trainer.loss_scale == 2.0 ** 16
    x = nd.array(np.full(1024, 3e-4 * 1024), dtype='float16')
    with autograd.record():   # d loss / d weight = x / 1024, about 3e-4
        loss = (weight.data() * x).astype('float32').mean()
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()
    trainer.unscale()
    true = np.float16(3e-4 * 1024).astype(np.float64) / 1024
    assert np.array_equal(weight.grad().asnumpy(), np.full(1024, true, np.float16))
    assert trainer.step(1) is True
    assert np.array_equal(weight.data().asnumpy(), np.full(1024, 1 - true, np.float16))


def test_amp_unscale_of_a_gluon_trainer_keeps_float16_gradients():
    dtype = 'float16'
    amp.disable()
    try:
        amp.init(mxmp.Policy(dtype, loss_scaler='dynamic'))
        net = gluon.nn.Dense(4, in_units=8)
        net.initialize(mx.init.Xavier())
        net.cast(dtype)
        params = net.collect_params()
        trainer = gluon.Trainer(params, 'sgd', {'learning_rate': 0.1, 'rescale_grad': 1 / 4})
        amp.init_trainer(trainer)
        trainer._amp_loss_scaler._loss_scale = 2.0 ** 24   # the cap: 2**-26 is 0 in float16
        grads = [_gradient(dtype, 2.0 ** 24, i, int(np.prod(p.shape))).reshape(p.shape)
                 for i, p in enumerate(params.values())]
        for p, g in zip(params.values(), grads):
            p.grad()[:] = g
        with autograd.record():
            with amp.scale_loss(nd.array([1.0]), trainer):
                pass
        amp.unscale(trainer)
        nonzero = 0
        for p, g in zip(params.values(), grads):
            got, want = _f32(p.grad()), _round(_f32(g) * (1 / 4 / 2.0 ** 24), dtype)
            assert np.array_equal(got, want)
            nonzero += np.count_nonzero(got)
        assert nonzero > 10 and trainer._scale == 1.0
    finally:
        amp.disable()


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_multiply_and_divide_are_exact_for_dense_and_row_sparse_arrays(dtype):
    dense = nd.amp_cast(nd.array(np.linspace(1e-3, 2, 12).reshape(4, 3)), dtype=mx_dtype(dtype))
    want = _round(_f32(dense) * 2.0 ** 20, dtype)
    assert np.array_equal(_f32(multiply(dense, 2.0 ** 20)), _f32(dense) * 2.0 ** 20)
    divide(multiply(dense, 2.0 ** 20, out=dense), 2.0 ** 20, out=dense)   # in place, back
    assert np.array_equal(_f32(dense), _round(want / 2.0 ** 20, dtype))
    sparse = nd.sparse.row_sparse_array((np.full((2, 3), 3e-4), [0, 2]), shape=(4, 3))
    sparse = sparse.astype(mx_dtype(dtype)) if dtype == 'float16' else sparse
    if dtype == 'float16':
        divide(sparse, 2.0 ** 16, out=sparse)
        assert sparse.stype == 'row_sparse'
        assert np.array_equal(sparse.indices.asnumpy(), [0, 2])
        assert np.array_equal(sparse.asnumpy()[0], np.float16(np.float16(3e-4) / 2 ** 16) *
                              np.ones(3, np.float16))


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_a_low_precision_loss_is_scaled_in_float32(dtype):
    loss = nd.amp_cast(nd.array([2.0, 3e-3]), dtype=mx_dtype(dtype))
    scaled = scale_losses(loss, 2.0 ** 16)
    assert scaled.dtype == np.float32
    assert np.array_equal(scaled.asnumpy(), _f32(loss) * 2.0 ** 16)
