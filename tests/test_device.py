"""mxmp.lp_kernels_available: a probe that other computations cannot poison."""
import mxnet as mx
import pytest
from mxnet import gluon, nd
from mxnet.contrib.amp.amp import bfloat16

import mxmp
from mxmp import device


@pytest.fixture
def fresh_probe():
    """The probe's cache emptied before and after the test; yields the clean answer."""
    device._probe.cache_clear()
    answer = mxmp.lp_kernels_available('bfloat16')
    device._probe.cache_clear()
    yield answer
    device._probe.cache_clear()


def pending_failure():
    """Queue an op that fails asynchronously: amp_cast of a depthwise weight that a float32
    inference forward left in oneDNN's blocked layout (MXNet 1.9.1, any CPU)."""
    net = gluon.nn.Conv2D(16, 3, groups=16, in_channels=16)
    net.initialize()
    net(nd.ones((1, 16, 8, 8))).wait_to_read()
    return nd.amp_cast(net.weight.data(), dtype=bfloat16)


def test_a_pending_unrelated_failure_neither_flips_the_answer_nor_is_swallowed(fresh_probe):
    pending_failure()
    assert mxmp.lp_kernels_available('bfloat16') is fresh_probe
    # the failure is still the user's to see, at their next wait
    with pytest.raises(mx.base.MXNetError, match='reorder primitive'):
        nd.waitall()
    assert mxmp.lp_kernels_available('bfloat16') is fresh_probe


def test_an_error_that_is_not_a_missing_kernel_is_raised_and_not_cached(fresh_probe,
                                                                        monkeypatch):
    def broken(*args, **kwargs):
        raise mx.base.MXNetError('out of memory')
    monkeypatch.setattr(mx.nd, 'Convolution', broken)
    with pytest.raises(mx.base.MXNetError, match='out of memory'):
        mxmp.lp_kernels_available('bfloat16')
    monkeypatch.undo()
    assert mxmp.lp_kernels_available('bfloat16') is fresh_probe


def test_float16_on_a_cpu_is_never_available():
    assert mxmp.lp_kernels_available('float16') is False
    assert mxmp.lp_kernels_available('float16', mx.cpu(1)) is False
