"""contrib.amp's trainer state on an mxmp.amp gluon.Trainer: the fields contrib.amp 1.9.1's
``init_trainer`` attaches (``trainer._amp_loss_scaler`` with ``_loss_scale``,
``_next_loss_scale``, ``_unskipped``, ``_scale_seq_len``, ``_max_loss_scale``;
``trainer._scale``, ``trainer._amp_original_scale``) read the live values of mxmp's scaler and
writing them changes the scale the next step uses (docs/from_contrib_amp.md)."""
import functools
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxmp
from mxmp import amp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_amp():
    amp.disable()
    yield
    amp.disable()


def setup(dtype='float16', policy=None, seed=0):
    amp.init(policy or dtype)
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, in_units=8, activation='relu'), nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.01})
    amp.init_trainer(trainer)
    return net, trainer


def data(seed=0, scale=1.0):
    rng = np.random.RandomState(seed)
    return (mx.nd.array(rng.normal(size=(8, 8)) * scale),
            mx.nd.array(rng.randint(0, 4, size=8)))


def step(net, trainer, x, y, by=1.0):
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y).mean() * by
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    trainer.step(1)


def test_the_fields_start_at_contrib_amps_values_and_follow_the_scaler():
    net, trainer = setup('float16')
    s = trainer._amp_loss_scaler
    assert (s._loss_scale, s._next_loss_scale, s._unskipped, s._scale_seq_len,
            s._max_loss_scale, s.loss_scale) == (2.0 ** 16, 2.0 ** 16, 0, 2000, 2.0 ** 24,
                                                 2.0 ** 16)
    assert trainer._amp_original_scale == trainer._scale == 1.0
    x, y = data()
    step(net, trainer, x, y)
    assert trainer._scale == 2.0 ** -16          # rescale / loss scale, set by scale_loss
    assert (s._loss_scale, s._unskipped) == (2.0 ** 16, 1)
    step(net, trainer, x, y, by=float('inf'))
    assert (s._loss_scale, s._next_loss_scale, s._unskipped, s.skipped_steps) == \
        (2.0 ** 15, 2.0 ** 15, 0, 1)
    assert s._loss_scale == s.scaler.scale       # a view, not a copy


def test_scale_seq_len_is_the_growth_interval_and_max_loss_scale_the_cap():
    net, trainer = setup('float16')
    s = trainer._amp_loss_scaler
    s._scale_seq_len = 2
    s._max_loss_scale = 2.0 ** 17
    x, y = data()
    scales = []
    for _ in range(6):
        step(net, trainer, x, y)
        scales.append(s._loss_scale)
    assert scales == [2.0 ** 16, 2.0 ** 17, 2.0 ** 17, 2.0 ** 17, 2.0 ** 17, 2.0 ** 17]
    assert s.scaler.growth_interval == 2 and s.scaler.max_scale == 2.0 ** 17


def test_a_written_loss_scale_is_the_one_the_next_step_multiplies_by():
    net, trainer = setup('float16')
    s = trainer._amp_loss_scaler
    s._loss_scale, s._next_loss_scale, s._unskipped = 256.0, 256.0, 1999
    x, y = data()
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y).mean()
        with amp.scale_loss(loss, trainer) as scaled:
            assert scaled.asscalar() == pytest.approx(256.0 * loss.asscalar(), rel=1e-6)
            autograd.backward(scaled)
    assert trainer._scale == 1.0 / 256
    trainer.step(1)
    assert (s._loss_scale, s._unskipped) == (512.0, 0)     # the 2000th finite step grew it


def test_next_loss_scale_written_alone_becomes_the_scale_at_the_next_check():
    """contrib.amp: ``has_overflow`` first sets ``_loss_scale = _next_loss_scale``, then halves
    or counts; writing ``_loss_scale`` alone leaves ``_next_loss_scale`` as it was."""
    net, trainer = setup('float16')
    s = trainer._amp_loss_scaler
    x, y = data()
    s._loss_scale = 1024.0
    assert s._next_loss_scale == 2.0 ** 16
    step(net, trainer, x, y)                   # scaled by 1024, then the scale is 2**16 again
    assert (s._loss_scale, s._next_loss_scale) == (2.0 ** 16, 2.0 ** 16)
    s._next_loss_scale = 64.0
    assert s._loss_scale == 2.0 ** 16
    step(net, trainer, x, y, by=float('inf'))  # 64 at the check, halved by the overflow
    assert (s._loss_scale, s._next_loss_scale) == (32.0, 32.0)


def test_unknown_fields_and_bad_values_raise():
    _, trainer = setup('float16')
    s = trainer._amp_loss_scaler
    with pytest.raises(AttributeError):
        s._growth_factor                                        # not contrib.amp's
    with pytest.raises(AttributeError, match='_scale_seq_len'):
        s._scale_seq_length = 100                               # a typo is not accepted
    with pytest.raises(AttributeError):
        s.loss_scale = 4.0                                      # read-only, as contrib.amp's
    for name, value in [('_loss_scale', 0.0), ('_loss_scale', float('inf')),
                        ('_loss_scale', -2.0), ('_next_loss_scale', float('nan')),
                        ('_unskipped', -1), ('_unskipped', 2.5), ('_scale_seq_len', 0),
                        ('_scale_seq_len', 2.5), ('_max_loss_scale', 0.0),
                        ('_loss_scale', '1024')]:   # contrib.amp would fail later on these
        with pytest.raises(ValueError, match=name):
            setattr(s, name, value)
    assert (s._loss_scale, s._unskipped, s._scale_seq_len) == (2.0 ** 16, 0, 2000)


def test_bfloat16_without_scaling_reads_contrib_fields_and_refuses_a_scale():
    net, trainer = setup('bfloat16')
    s = trainer._amp_loss_scaler
    assert (s._loss_scale, s._next_loss_scale, s._unskipped) == (1.0, 1.0, 0)
    s._loss_scale, s._next_loss_scale, s._unskipped = 1.0, 1.0, 0    # a resume: accepted
    with pytest.warns(UserWarning, match='changes nothing'):
        s._scale_seq_len = 100
    assert s._scale_seq_len == 100
    with pytest.raises(ValueError, match="loss_scaler='dynamic'"):
        s._loss_scale = 2.0 ** 16
    x, y = data()
    step(net, trainer, x, y)
    assert trainer._scale == 1.0 and s._loss_scale == 1.0


def test_bfloat16_with_dynamic_scaling_has_every_field():
    _, trainer = setup(policy=mxmp.Policy('bfloat16', loss_scaler='dynamic'))
    s = trainer._amp_loss_scaler
    s._scale_seq_len = 10
    assert (s._loss_scale, s._scale_seq_len, s.scaler.growth_interval) == (2.0 ** 16, 10, 10)


def test_unscale_has_contrib_amps_meaning_with_a_rescale_grad():
    """contrib.amp's unscale multiplies the gradients by ``trainer._scale`` (rescale_grad /
    loss scale) and sets it to 1; the update is the same as without unscale."""
    x, y = data()
    results = []
    for unscale in (False, True):
        amp.disable()
        net, _ = setup('float16')
        trainer = gluon.Trainer(net.collect_params(), 'sgd',
                                {'learning_rate': 0.1, 'rescale_grad': 0.5})
        amp.init_trainer(trainer)
        assert trainer._amp_original_scale == 0.5
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y).mean()
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        scaled_grad = net[0].weight.grad().asnumpy().copy()
        if unscale:
            amp.unscale(trainer)
            assert trainer._scale == 1.0
            np.testing.assert_allclose(net[0].weight.grad().asnumpy(),
                                       scaled_grad * 0.5 / 2.0 ** 16, rtol=1e-6)
            amp.unscale(trainer)                 # contrib.amp's second call changes nothing
            np.testing.assert_allclose(net[0].weight.grad().asnumpy(),
                                       scaled_grad * 0.5 / 2.0 ** 16, rtol=1e-6)
        trainer.step(1)
        results.append(net[0].weight.data().asnumpy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)


def test_the_hook_is_only_on_gluon_trainers_mxmp_trainer_keeps_its_own_state():
    amp.init('float16')
    net = nn.Dense(4, in_units=8)
    net.initialize()
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    amp.init_trainer(trainer)
    with pytest.raises(AttributeError):
        trainer._amp_loss_scaler


# --- checkpoint and resume in a new process -------------------------------------------------

@functools.lru_cache(maxsize=None)
def worker(*args):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-m', 'tests.amp.trainer_state_worker', *args],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The float16 run (loss summed over 32 samples, _scale_seq_len 3) overflows at steps 0-5, 9
# and 19 and grows at 8, 12, 15, 18; at the saves: after step 6 one finite step counted at
# 1024; after step 9 an overflow just halved 2048.
@pytest.mark.parametrize('dtype,extra,save_at,steps', [
    ('float16', [], 7, 20), ('float16', [], 10, 20),
    ('bfloat16', [], 6, 10), ('bfloat16', ['--dynamic'], 7, 12)])
def test_pickled_fields_resume_the_same_schedule_bit_for_bit_in_a_new_process(
        tmp_path, dtype, extra, save_at, steps):
    whole = worker(dtype, '--steps', str(steps), *extra)   # cached: the same for both saves
    first = worker(dtype, '--steps', str(steps), '--save-at', str(save_at), '--dir',
                   str(tmp_path), *extra)
    with open(tmp_path / 'amp.pkl', 'rb') as fp:
        saved, at = pickle.load(fp)
    assert at == save_at and saved == [whole['steps'][save_at - 1][k]
                                       for k in ('loss_scale', 'next', 'unskipped')]
    rest = worker(dtype, '--steps', str(steps), '--resume', str(tmp_path), *extra)
    assert first['steps'] + rest['steps'] == whole['steps']
    assert rest['weights'] == whole['weights']
    events = whole['steps']
    if dtype == 'float16':   # the schedule has both kinds of event on both sides of the save
        skips = [s['step'] for s in events if s['skipped']]
        grows = [s['step'] for s in events[1:] if s['loss_scale'] > events[s['step'] - 1][
            'loss_scale']]
        assert any(k < save_at for k in skips) and any(k >= save_at for k in skips)
        assert any(k >= save_at for k in grows)
    elif extra:
        assert events[-1]['loss_scale'] > events[0]['loss_scale'] and \
            not any(s['skipped'] for s in events)
    else:
        assert {s['loss_scale'] for s in events} == {1.0}
