"""mxmp's Updater checks the dtypes, storage and devices of a call's arrays once, not at every
step, and checks them again whenever they or the optimizer object change: the same numbers as
gluon.Trainer / MXNet's Updater through changes of learning rate, arrays, storage and
optimizer, and a custom optimizer's fallback to MXNet's updater logged with its reason."""
import logging

import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon

import mxmp
from mxmp._src.training import updater as updater_module
from mxmp._src.training.updater import Updater


def _net(seed):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation='relu'), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    return net


def _train(trainer_cls, steps=5, seed=0):
    net = _net(seed)
    trainer = trainer_cls(net.collect_params(), 'sgd',
                          {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-3,
                           'clip_gradient': 0.05})
    rng = np.random.RandomState(seed)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(steps):
        x = mx.nd.array(rng.randn(8, 10) * (1e3 if step == 1 else 1.0))   # clipped grads
        y = mx.nd.array(rng.randint(0, 4, 8))
        if step == 3:
            trainer.set_learning_rate(0.025)   # a new learning rate between steps
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(8)
    return [p.data().asnumpy() for p in net.collect_params().values()], trainer


def test_the_array_checks_run_once_while_the_arrays_stay(monkeypatch):
    calls = []
    original = updater_module.runs_single_array

    def counted(*args):
        calls.append(1)
        return original(*args)
    monkeypatch.setattr(updater_module, 'runs_single_array', counted)
    ours, trainer = _train(mxmp.Trainer, steps=5)
    theirs, _ = _train(gluon.Trainer, steps=5)
    assert len(calls) == 1   # 5 steps, one device, the same arrays: checked at the first
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    assert trainer._optimizer.num_update == 5


def _sparse_grad(rng, shape, rows):
    dense = np.zeros(shape, dtype='float32')
    dense[rows] = rng.randn(len(rows), *shape[1:])
    return mx.nd.array(dense).tostype('row_sparse')


class _DoubledLearningRate(mx.optimizer.SGD):
    """A custom optimizer: SGD whose update uses twice its learning rate."""

    def _get_lrs(self, indices):
        return [2 * lr for lr in super()._get_lrs(indices)]


def _changing_run(updater_cls):
    """Weights after a run whose learning rate, arrays, gradient storage and optimizer change
    between calls of one updater."""
    rng = np.random.RandomState(0)
    shapes = [(6, 3), (6,), (5, 4)]
    opt = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-2, rescale_grad=0.5)
    upd = updater_cls(opt)
    weights = [mx.nd.array(rng.randn(*s)) for s in shapes]
    for step in range(7):
        if step == 2:
            opt.set_learning_rate(0.03)
        if step == 3:   # new arrays, and sparse gradients: MXNet's lazy update
            weights = [w.copy() for w in weights]
        if step in (3, 4):
            grads = [_sparse_grad(rng, s, [1, 4]) for s in shapes]
        else:
            grads = [mx.nd.array(rng.randn(*s)) for s in shapes]
        if step == 5:   # the same arrays, another optimizer object (a custom one)
            custom = _DoubledLearningRate(learning_rate=0.03, momentum=0.9, wd=1e-2,
                                          rescale_grad=0.5)
            custom.num_update = opt.num_update
            custom._index_update_count = dict(opt._index_update_count)
            upd.optimizer = opt = custom
        upd(list(range(len(shapes))), grads, weights)
    return [w.asnumpy() for w in weights]


def test_changes_of_learning_rate_arrays_storage_and_optimizer_are_seen():
    ours = _changing_run(Updater)
    theirs = _changing_run(mx.optimizer.Updater)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


def test_a_custom_optimizer_falls_back_to_mxnets_updater_with_the_reason_logged(caplog):
    opt = _DoubledLearningRate(learning_rate=0.1, momentum=0.9)
    upd = Updater(opt)
    w, g = mx.nd.ones((3, 3)), mx.nd.ones((3, 3))
    ref_w = w.copy()
    ref = mx.optimizer.Updater(_DoubledLearningRate(learning_rate=0.1, momentum=0.9))
    with caplog.at_level(logging.DEBUG, logger='mxmp.updater'):
        for _ in range(3):
            upd([0], [g], [w])
            ref([0], [g], [ref_w])
    np.testing.assert_array_equal(w.asnumpy(), ref_w.asnumpy())
    messages = [r.getMessage() for r in caplog.records if r.name == 'mxmp.updater']
    assert len(messages) == 1, messages   # once per change of the arrays, not per step
    assert '_DoubledLearningRate, not mx.optimizer.SGD' in messages[0]


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_the_float32_gradient_copies_are_not_kept_after_a_step(dtype):
    net = _net(0)
    net = mxmp.convert(net, target_dtype=dtype, cast_params=True, emulate='auto')
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1,
                                                         'momentum': 0.9})
    x = mx.nd.array(np.random.RandomState(0).randn(8, 10))
    for _ in range(2):
        with autograd.record():
            with trainer.scale_loss(net(x).sum()) as scaled:
                scaled.backward()
        trainer.step(8)
    mx.nd.waitall()
    # the updater's checks may hold the Parameters' own arrays (bfloat16: the library's one
    # pass reads the bfloat16 gradients themselves), never a float32 copy of a gradient
    params = list(net.collect_params().values())
    own = [a for p in params for a in p.list_data() + p.list_grad()] + \
        [m for i in range(len(params)) for m in trainer.master_weights(params[i])]
    kept = [a for entry in trainer._updaters[0]._checked.values() for a in entry[1]]
    assert all(any(a is b for b in own) for a in kept)
