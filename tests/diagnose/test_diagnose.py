"""mxmp._src.diagnose: per-layer numerics report (planted problems, references, loss scale)."""
import json
import math

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

from mxmp._src.diagnose.stats import BFLOAT16, FLOAT16, TensorStats
from mxmp._src.diagnose.report import NumericsReport
from mxmp._src.diagnose.capture import diagnose

TINY, BIG = 'net_tinyblock_tiny_fwd', 'net_big_fwd'


class TinyGradient(nn.HybridBlock):
    """A Dense layer whose gradients arrive multiplied by 1e-12 (forward unchanged)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(32, in_units=16, prefix='tiny_')

    def hybrid_forward(self, F, x):
        return F.contrib.gradientmultiplier(self.dense(x), scalar=1e-12)


def planted_net():
    """tiny-gradient Dense -> relu -> large-activation Dense (bias 1e5) -> LayerNorm -> ..."""
    net = nn.HybridSequential(prefix='net_')
    with net.name_scope():
        net.add(TinyGradient(prefix='tinyblock_'), nn.Activation('relu'),
                nn.Dense(32, in_units=32, prefix='big_', bias_initializer=mx.init.Constant(1e5)),
                nn.LayerNorm(in_channels=32), nn.Dense(32, in_units=32, prefix='mid_'),
                nn.Activation('relu'), nn.Dense(10, in_units=32, prefix='out_'))
    net.initialize(mx.init.Xavier())
    return net


@pytest.fixture(scope='module')
def batch():
    rng = np.random.RandomState(0)
    return (mx.nd.array(rng.normal(size=(16, 16))), mx.nd.array(np.arange(16) % 10))


@pytest.fixture(scope='module')
def planted(batch):
    mx.random.seed(1)
    net = planted_net()
    before = {k: v.data().asnumpy().copy() for k, v in net.collect_params().items()}
    report = diagnose(net, batch[0], batch[1], gluon.loss.SoftmaxCrossEntropyLoss(),
                      target_dtype='float16', steps=3, verbose=False)
    return net, before, report


def test_flags_exactly_the_planted_tiny_gradient_and_large_activation_layers(planted):
    _, _, report = planted
    assert set(report.excluded_names) == {TINY, BIG}
    reasons = report.reasons['float16']
    assert any('activations overflow' in r for r in reasons[BIG])
    assert any('gradients flush to zero even with loss scale' in r for r in reasons[TINY])
    assert not any('overflow' in r for r in reasons[TINY])


def test_planted_layers_numbers(planted):
    _, _, report = planted
    big, tiny = report.layer(BIG), report.layer(TINY)
    assert big.activation.overflow_fraction('float16') == 1.0     # every output ~1e5
    assert big.activation.max_abs > 65504
    assert tiny.act_grad.max_abs < 1e-10                          # 1e-12 x normal gradients
    assert tiny.act_grad.zero_fraction('float16', report.loss_scale['float16'].log2_scale) == 1.0
    for layer in report.layers:
        if layer.name not in (TINY, BIG):
            assert layer.activation.overflow_fraction('float16') == 0
            assert layer.act_grad.zero_fraction('float16',
                                                report.loss_scale['float16'].log2_scale) == 0


def test_bfloat16_range_holds_the_planted_values(planted):
    _, _, report = planted
    # 1e5 and 1e-12 are both inside bfloat16's range (float32's exponent)
    assert report.recommended('bfloat16') == ()
    assert report.layer(BIG).activation.overflow_fraction(BFLOAT16) == 0


def test_only_low_precision_nodes_are_reported(planted):
    _, _, report = planted
    ops = {layer.op for layer in report.layers}
    assert 'LayerNorm' not in ops                 # float32 class: never in float16
    assert {'FullyConnected', 'Activation'} <= ops


def test_the_network_is_not_modified(planted):
    net, before, _ = planted
    for k, v in net.collect_params().items():
        np.testing.assert_array_equal(v.data().asnumpy(), before[k])


def test_policy_from_report_keeps_flagged_layers_in_float32(planted):
    _, _, report = planted
    policy = report.policy()
    assert policy.target_dtype == 'float16'
    assert policy.excluded_names == frozenset({TINY, BIG})


def test_loss_scale_is_the_largest_power_of_two_keeping_the_max_gradient_finite(planted):
    _, _, report = planted
    adv = report.loss_scale['float16']
    assert adv.max_grad * adv.scale <= FLOAT16.max_finite
    assert adv.capped or adv.max_grad * adv.scale * 2 > FLOAT16.max_finite
    assert adv.log2_scale == math.floor(math.log2(65504 / adv.max_grad))


def test_gradients_match_imperative_autograd_reference(batch):
    """The probe-variable gradients equal d loss / d output computed by Gluon autograd."""
    mx.random.seed(2)
    net = nn.HybridSequential(prefix='ref_')
    with net.name_scope():
        net.add(nn.Dense(8, in_units=16, activation='relu', prefix='d0_'),
                nn.Dense(10, in_units=8, prefix='d1_'))
    net.initialize(mx.init.Xavier())
    x, y = batch
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    report = diagnose(net, x, y, loss_fn, steps=1, verbose=False)

    out = net(x)
    out.attach_grad()
    with autograd.record():
        loss = loss_fn(out, y)
    loss.backward()
    with autograd.record():
        loss2 = loss_fn(net(x), y)
    loss2.backward()
    layer = report.layer('ref_d1_fwd')
    assert layer.act_grad.max_abs == pytest.approx(float(np.abs(out.grad.asnumpy()).max()),
                                                   rel=1e-5)
    grads = [net.collect_params()[n].grad().asnumpy() for n in layer.params]
    assert layer.weight_grad.max_abs == pytest.approx(max(float(np.abs(g).max())
                                                          for g in grads), rel=1e-5)
    assert layer.activation.max_abs == pytest.approx(float(np.abs(out.asnumpy()).max()),
                                                     rel=1e-5)
    assert report.losses[0] == pytest.approx(float(loss.mean().asscalar()), rel=1e-5)


def test_tensor_stats_fractions_against_thresholds():
    values = np.array([1e5, 7e4, 1e-5, 1e-9, 0.0, 1.0, np.inf, -3e-6], dtype=np.float32)
    s = TensorStats.of(values)
    assert (s.count, s.zeros, s.nonfinite, s.nonzero) == (8, 1, 1, 6)
    assert s.overflow_fraction('float16') == pytest.approx(2 / 6)      # 1e5, 7e4 > 65504
    assert s.subnormal_fraction('float16') == pytest.approx(2 / 6)     # 1e-5, 3e-6
    assert s.zero_fraction('float16') == pytest.approx(1 / 6)          # 1e-9 < 2**-24
    # x 2**10: 1e-9 -> 1e-6 is subnormal, no longer zero; 1e-5, 3e-6 -> 0.01, 3e-3 are normal
    assert s.zero_fraction('float16', 10) == 0
    assert s.subnormal_fraction('float16', 10) == pytest.approx(1 / 6)
    assert s.overflow_fraction('bfloat16') == 0 and s.zero_fraction('bfloat16') == 0
    assert s.max_abs == pytest.approx(1e5)
    # the histogram bins are floor(log2|x|)
    assert s.hist.sum() == 6
    assert s.merge(s).nonzero == 12


def test_bfloat16_flush_threshold_is_smallest_normal():
    s = TensorStats.of(np.array([2.0 ** -127, 2.0 ** -126, 1.0], dtype=np.float32))
    assert s.zero_fraction('bfloat16') == pytest.approx(1 / 3)
    assert s.zero_fraction('float16') == pytest.approx(2 / 3)


def test_table_json_and_print(planted, capsys, batch):
    _, _, report = planted
    text = report.table()
    assert TINY in text and BIG in text and 'excluded_names' in text
    assert 'loss scale: 2^%d' % report.loss_scale['float16'].log2_scale in text
    assert report.table(flagged_only=True).count('\n') < text.count('\n')
    data = json.loads(json.dumps(report.to_dict()))
    assert data['recommended_float32']['float16'] == list(report.excluded_names)
    assert len(data['layers']) == len(report.layers)
    mx.random.seed(3)
    diagnose(planted_net(), batch[0], batch[1], gluon.loss.SoftmaxCrossEntropyLoss(), steps=1,
             target_dtype='float16')
    assert 'mxmp numerics report for float16' in capsys.readouterr().out


def test_bad_arguments_raise_clear_errors(batch):
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    with pytest.raises(ValueError, match='steps'):
        diagnose(planted_net(), batch[0], batch[1], loss, steps=0, verbose=False)
    with pytest.raises(ValueError, match='float16'):
        diagnose(planted_net(), batch[0], batch[1], loss, target_dtype='int8', verbose=False)
    with pytest.raises(TypeError, match='HybridBlock'):
        diagnose(object(), batch[0], batch[1], loss, verbose=False)
    fresh = nn.Dense(4, in_units=16)
    with pytest.raises(ValueError, match='initialize'):
        diagnose(fresh, batch[0], batch[1], loss, verbose=False)
    assert isinstance(diagnose(planted_net(), batch[0], batch[1], loss, steps=1,
                               verbose=False), NumericsReport)


def test_target_dtype_defaults_to_bfloat16_or_the_policys_and_must_agree_with_it(batch):
    from mxmp._src.policy.policy import Policy
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    mx.random.seed(3)
    assert diagnose(planted_net(), batch[0], batch[1], loss, steps=1,
                    verbose=False).target_dtype == 'bfloat16'
    assert diagnose(planted_net(), batch[0], batch[1], loss, steps=1, verbose=False,
                    policy=Policy('float16')).target_dtype == 'float16'
    with pytest.raises(ValueError, match='contradicts'):
        diagnose(planted_net(), batch[0], batch[1], loss, target_dtype='bfloat16',
                 policy=Policy('float16'), verbose=False)


def test_residual_rule_identity_is_not_a_layer(planted, batch):
    """Policy(residual_dtype='target') adds an identity after the LayerNorm to explain's graph
    (the residual rule's ``_copy``): diagnose failed on it with a KeyError. It is no layer of
    the network: the report is the default policy's, layer for layer."""
    from mxmp._src.policy.policy import Policy
    mx.random.seed(1)
    report = diagnose(planted_net(), batch[0], batch[1], gluon.loss.SoftmaxCrossEntropyLoss(),
                      steps=3, verbose=False, policy=Policy('float16', residual_dtype='target'))
    want = planted[2]
    assert [(y.name, y.op) for y in report.layers] == [(y.name, y.op) for y in want.layers]
    assert 'net_mid_fwd' in [y.name for y in report.layers]   # reads the rule's identity
    assert set(report.excluded_names) == set(want.excluded_names) == {TINY, BIG}
    for got, ref in zip(report.layers, want.layers):   # float32 iterations: the same numbers
        assert got.activation.max_abs == pytest.approx(ref.activation.max_abs, rel=1e-5)
