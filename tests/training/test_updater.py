"""mxmp's updater: SGD on a CPU updates all weights of a call in one pass of the library's
``mxmp_multi_sgd_update`` (without the library: one MXNet kernel call per weight), with the same
numbers as MXNet's aggregated update (update counts and learning rates included), and leaves
every other optimizer to MXNet's Updater."""
import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon

import mxmp
from mxmp._src.training import updater as updater_module
from mxmp._src.training.updater import Updater, library_update, runs_single_array

SHAPES = [(8, 3, 3, 3), (8,), (16, 8, 1, 1), (10, 64), (10,)]


def _arrays(seed):
    rng = np.random.RandomState(seed)
    return [mx.nd.array(rng.randn(*s)) for s in SHAPES]


def _run(updater_cls, opt_factory, steps=3, stale=()):
    """Weights and states after ``steps`` updater calls over SHAPES; the indices in ``stale``
    are left out of every call but the last (a parameter whose gradient was stale)."""
    opt = opt_factory()
    updater = updater_cls(opt)
    weights = _arrays(0)
    for step in range(steps):
        grads = _arrays(step + 1)
        live = [i for i in range(len(weights)) if i not in stale or step == steps - 1]
        updater(live, [grads[i] for i in live], [weights[i] for i in live])
    states = []
    for i in range(len(weights)):
        st = updater.states[i]
        states += [s for s in (st if isinstance(st, (list, tuple)) else [st]) if s is not None]
    return [w.asnumpy() for w in weights] + [s.asnumpy() for s in states], opt


def _count_calls(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture(params=['library', 'mxnet_kernel'])
def sgd_path(request, monkeypatch):
    """Both ways the Updater runs SGD: the library's one pass, MXNet's kernel per weight."""
    if request.param == 'library':
        if not library_update():
            pytest.skip("mxmp's operator library does not build here")
    else:
        monkeypatch.setattr(updater_module, 'library_update', lambda: False)
    return request.param


SGD_CASES = {
    'momentum': lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, rescale_grad=1 / 16.),
    'momentum_wd_clip': lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3,
                                                 clip_gradient=0.5, rescale_grad=0.25),
    'scheduler_and_mults': lambda: _with_mults(mx.optimizer.SGD(
        learning_rate=0.1, momentum=0.5,
        lr_scheduler=mx.lr_scheduler.FactorScheduler(step=1, factor=0.5))),
    'no_momentum': lambda: mx.optimizer.SGD(learning_rate=0.05, wd=1e-4),
    # values that MXNet's scalar float parser (sgd_mom_update's lr=) rounds 1 ulp off
    'hard_to_parse_lr_wd': lambda: mx.optimizer.SGD(learning_rate=2.2655846366566674e-05,
                                                    wd=3.2772236137436455e-05, momentum=0.9),
    'cosine_schedule': lambda: mx.optimizer.SGD(
        momentum=0.9, lr_scheduler=mx.lr_scheduler.CosineScheduler(max_update=7, base_lr=0.1)),
}


def _with_mults(opt):
    opt.set_lr_mult({0: 0.1, 3: 2.0})
    opt.set_wd_mult({1: 0.0})
    opt.wd = 1e-3
    return opt


@pytest.mark.parametrize('case', sorted(SGD_CASES))
def test_sgd_single_array_update_is_bit_identical_to_the_aggregated_update(case, sgd_path):
    ours, opt_ours = _run(Updater, SGD_CASES[case])
    ref, opt_ref = _run(mx.optimizer.Updater, SGD_CASES[case])
    _assert_identical(ours, ref)
    assert opt_ours.num_update == opt_ref.num_update == 3


@pytest.mark.parametrize('stale', [(0,), (0, 1), (4,)])
def test_a_stale_parameter_under_a_scheduler_gets_mxnets_learning_rate(stale, sgd_path):
    """MXNet counts a whole chunk before reading its learning rates: a parameter that missed
    updates, first in its chunk, must see the chunk's step, not its own."""
    case = SGD_CASES['scheduler_and_mults']
    ours, opt_ours = _run(Updater, case, steps=3, stale=stale)
    ref, opt_ref = _run(mx.optimizer.Updater, case, steps=3, stale=stale)
    _assert_identical(ours, ref)
    assert opt_ours._index_update_count == opt_ref._index_update_count


def _assert_identical(ours, ref):
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)


def test_sgd_on_cpu_calls_the_kernel_once_per_weight(monkeypatch):
    monkeypatch.setattr(updater_module, 'library_update', lambda: False)   # no library
    import mxnet.optimizer.optimizer as optmod
    theirs = _count_calls(monkeypatch, optmod, 'multi_sgd_mom_update')
    ours = []
    original = mx.nd.multi_sgd_mom_update

    def counted(*args, **kwargs):
        ours.append(kwargs['num_weights'])
        return original(*args, **kwargs)
    monkeypatch.setattr(mx.nd, 'multi_sgd_mom_update', counted)
    _run(Updater, SGD_CASES['momentum'], steps=1)
    assert theirs == [] and ours == [1] * len(SHAPES)
    _run(mx.optimizer.Updater, SGD_CASES['momentum'], steps=1)
    # MXNet's Updater: 5 weights in calls of MXNET_OPTIMIZER_AGGREGATION_SIZE (default 4)
    assert len(theirs) == -(-len(SHAPES) // mx.optimizer.SGD().aggregate_num)


def test_sgd_on_cpu_with_the_library_is_one_pass_over_every_weight(monkeypatch):
    if not library_update():
        pytest.skip("mxmp's operator library does not build here")
    calls = []
    for name in ('multi_sgd_mom_update', 'mxmp_multi_sgd_update'):
        original = getattr(mx.nd, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls.append((_name, kwargs['num_weights']))
            return _original(*args, **kwargs)
        monkeypatch.setattr(mx.nd, name, counted)
    _run(Updater, SGD_CASES['momentum'], steps=2)
    assert calls == [('mxmp_multi_sgd_update', len(SHAPES))] * 2


@pytest.mark.parametrize('factory', [
    lambda: mx.optimizer.Adam(learning_rate=0.01),
    lambda: mx.optimizer.NAG(learning_rate=0.1, momentum=0.9),
    lambda: mx.optimizer.create('ccsgd', learning_rate=0.1, momentum=0.9),
], ids=['adam', 'nag', 'ccsgd_subclass'])
def test_other_optimizers_go_to_mxnets_updater_unchanged(factory):
    ours, _ = _run(Updater, factory)
    ref, _ = _run(mx.optimizer.Updater, factory)
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)
    assert not runs_single_array(factory(), _arrays(0), _arrays(1))


def test_float16_weights_and_sparse_gradients_are_left_to_mxnet():
    sgd = mx.optimizer.SGD(momentum=0.9)
    w = mx.nd.ones((4, 4))
    assert runs_single_array(sgd, [w], [w])
    assert not runs_single_array(sgd, [w.astype('float16')], [w.astype('float16')])
    assert runs_single_array(mx.optimizer.SGD(momentum=0.0), [w], [w])
    assert not runs_single_array(sgd, [w], [w.tostype('row_sparse')])


def _train(trainer_cls, seed=0, steps=3):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation='relu'), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    trainer = trainer_cls(net.collect_params(), 'sgd',
                          {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-4})
    rng = np.random.RandomState(seed)
    x = mx.nd.array(rng.randn(8, 10))
    y = mx.nd.array(rng.randint(0, 4, 8))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(8)
    return trainer, [p.data().asnumpy() for p in net.collect_params().values()]


def test_mxmp_trainer_uses_the_updater_and_matches_gluon_trainer_bit_for_bit():
    trainer, ours = _train(lambda *a: mxmp.Trainer(*a, target_dtype='float32'))
    assert all(type(u) is Updater for u in trainer._updaters)
    _, ref = _train(gluon.Trainer)
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


def test_mxmp_module_uses_the_updater():
    data = mx.sym.var('data')
    out = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=4, name='fc'),
                               name='softmax')
    mod = mxmp.Module(out, target_dtype='float32', context=mx.cpu())
    mod.bind(data_shapes=[('data', (8, 10))], label_shapes=[('softmax_label', (8,))])
    mod.init_params()
    mod.init_optimizer(optimizer='sgd', optimizer_params={'momentum': 0.9})
    assert type(mod._updater) is Updater
