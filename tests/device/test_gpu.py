"""The real float16 graph on an NVIDIA GPU (mxnet-cu112), against float32.

Every test marked ``gpu`` needs ``mx.gpu(0)`` and a CUDA build of MXNet; without them the
tests are skipped with the reason (no machine of the project has a GPU: these run on a GPU
runner with ``pip install -e '.[cu112,test]'`` and ``pytest -m gpu``). The last test checks
the skip logic itself and runs everywhere.
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.training.trainer import Trainer


def gpu_skip_reason(num_gpus=None):
    """None when ``mx.gpu(0)`` can run float16, else why not (for pytest's skip reason)."""
    num_gpus = num_gpus or mx.context.num_gpus
    try:
        count = num_gpus()
    except Exception as err:  # MXNetError from a CUDA build without driver, or similar
        return 'mx.context.num_gpus() failed (%s: %s): no usable CUDA build of MXNet' % (
            type(err).__name__, err)
    if not count:
        features = mx.runtime.Features()
        if not features.is_enabled('CUDA'):
            return 'this MXNet build has no CUDA (install mxnet-cu112: pip install ' \
                   '"mxmp[cu112]")'
        return 'no GPU visible to MXNet (mx.context.num_gpus() == 0)'
    return None


_REASON = gpu_skip_reason()
needs_gpu = [pytest.mark.gpu, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


def conv_net(seed=0):
    net = gluon.nn.HybridSequential(prefix='gpunet_')
    with net.name_scope():
        net.add(gluon.nn.Conv2D(16, 3, padding=1, in_channels=8),
                gluon.nn.BatchNorm(in_channels=16),
                gluon.nn.Activation('relu'),
                gluon.nn.MaxPool2D(2),
                gluon.nn.Conv2D(32, 3, padding=1, in_channels=16),
                gluon.nn.Activation('relu'),
                gluon.nn.GlobalAvgPool2D(),
                gluon.nn.Dense(16, in_units=32))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier(), ctx=mx.gpu(0))
    return net


def batch(seed=1, n=16):
    rng = np.random.RandomState(seed)
    x = nd.array(rng.standard_normal((n, 8, 16, 16)), ctx=mx.gpu(0))
    y = nd.array(rng.randint(0, 16, size=n), ctx=mx.gpu(0))
    return x, y


def train(net, updates, loss_scaler, x, y):
    """SGD on one batch until ``updates`` steps were applied (a dynamic loss scaler skips the
    steps that overflow while it backs off from 2**16). Returns the loss before each applied
    update, and the Trainer."""
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.05, 'momentum': 0.9},
                      loss_scaler=loss_scaler)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for _ in range(updates + 40):
        with autograd.record():
            loss = loss_fn(net(x), y)
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        if trainer.step(x.shape[0]):
            losses.append(float(loss.mean().asscalar()))
        if len(losses) == updates:
            break
    return losses, trainer


class TestFloat16OnGpu:
    pytestmark = needs_gpu

    def test_kernels_are_available(self):
        assert mxmp.lp_kernels_available('float16', mx.gpu(0))

    def test_forward_matches_float32_within_float16_precision(self):
        net = conv_net()
        x, _ = batch()
        expected = net(x).asnumpy()
        converted = mxmp.convert(net, 'float16')
        out = converted(x)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out.asnumpy(), expected, rtol=2e-2, atol=2e-2)
        assert mxmp.count_casts(mxmp.converted_graph(converted))['amp_cast'] > 0

    def test_emulation_on_cpu_predicts_the_real_float16_graph(self):
        net = conv_net()
        x, _ = batch()
        real = mxmp.convert(net, 'float16')(x).asnumpy()
        emulated = mxmp.convert(net, 'float16', emulate=True)(x).asnumpy()
        float32 = net(x).asnumpy()
        # Same float16 rounding points; only the kernels' summation order differs.
        assert np.abs(real - emulated).max() <= np.abs(real - float32).max() + 1e-3

    def test_training_steps_with_dynamic_loss_scaling_follow_float32(self):
        x, y = batch()
        reference, _ = train(conv_net(), 10, 'none', x, y)
        net = conv_net()
        losses, trainer = train(mxmp.convert(net, 'float16'), 10, 'dynamic', x, y)
        assert len(losses) == 10 and trainer.loss_scale >= 1.0
        assert all(np.isfinite(losses))
        assert losses[-1] < losses[0]
        np.testing.assert_allclose(losses, reference, rtol=5e-2, atol=5e-2)

    def test_cast_params_keeps_float32_master_weights_on_gpu(self):
        x, y = batch()
        net = conv_net()
        converted = mxmp.convert(net, 'float16', cast_params=True)
        losses, trainer = train(converted, 5, 'dynamic', x, y)
        weight = net.collect_params()['gpunet_conv0_weight']
        assert weight.data().dtype == np.float16
        master = trainer.master_weights(weight)[0]
        assert master.dtype == np.float32 and master.context == mx.gpu(0)
        np.testing.assert_array_equal(
            weight.data().asnumpy(), master.astype('float16').asnumpy())
        assert all(np.isfinite(losses)) and losses[-1] < losses[0]

    def test_probe_keeps_mxnets_message_of_a_real_gpu_failure_and_probes_again(
            self, monkeypatch):
        """Issue 36 item 8: an out-of-memory during the probe is a GpuProbeError with MXNet's
        own text, not "no float16 kernels", and is not cached."""
        from mxmp._src import device
        held = []

        def exhaust(ctx, target):
            for _ in range(64):   # 16 GiB each, until MXNet's allocator gives up
                held.append(nd.zeros((2 ** 31 - 1,), ctx=ctx, dtype='float64'))
                held[-1].wait_to_read()
        device._probe.cache_clear()
        monkeypatch.setattr(device, '_run_probe', exhaust)
        with pytest.raises(mxmp.GpuProbeError, match='not for want of a kernel') as info:
            mxmp.lp_kernels_available('float16', mx.gpu(0))
        assert 'memory' in info.value.mxnet_message.lower()
        del held[:]
        monkeypatch.undo()
        assert mxmp.lp_kernels_available('float16', mx.gpu(0)) is True

    def test_a_gpu_without_tensor_cores_is_told_so(self):
        from mxmp._src import device
        capability = device.gpu_compute_capability(0)
        assert capability is not None and capability >= (3, 0)
        device.tensor_core_note.cache_clear()
        note = device.tensor_core_note(0)
        assert (note is None) == (capability >= (7, 0))
        device.tensor_core_note.cache_clear()


def test_gpu_tests_skip_with_a_reason_when_mxnet_has_no_gpu():
    def raises():
        raise mx.base.MXNetError('CUDA: no CUDA-capable device is detected')

    assert 'num_gpus() failed' in gpu_skip_reason(raises)
    assert 'no CUDA-capable device' in gpu_skip_reason(raises)
    no_gpu = gpu_skip_reason(lambda: 0)
    assert no_gpu is not None and ('no CUDA' in no_gpu or 'no GPU' in no_gpu)
    assert gpu_skip_reason(lambda: 1) is None
    if mx.context.num_gpus() == 0:
        assert _REASON is not None
