"""The library's SGD pass (``mxmp_multi_sgd_update``, run by mxmp's Updater) against MXNet:
bit for bit against ``multi_sgd_mom_update`` / ``multi_sgd_update`` on adversarial values
(inf, NaN, subnormals, overflow, signed zeros, learning rates MXNet's scalar parser rounds its
own way), the bfloat16 weights it writes against ``amp_cast`` of the masters, and whole
``mxmp.Trainer`` runs (cast_params=False and True, clipping, schedules, a skipped overflowing
step) against the same Trainer on MXNet's kernels."""
import numpy as np
import mxnet as mx
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.dtypes import mx_dtype
from mxmp._src.training import updater as updater_module
from mxmp._src.training.master_weights import is_low_precision
from mxmp._src.training.updater import library_update

BF16 = mx_dtype('bfloat16')
# 40000 values span three of the library's blocks (16384): the parallel split is exercised
SHAPES = [(3, 5), (40000,), (1,), (33, 100), (17,), (2, 2, 2)]

pytestmark = pytest.mark.skipif(not library_update(),
                                reason="mxmp's operator library does not build here")


def _bits(a):
    """float32 bits of an NDArray (bfloat16 widened exactly), every NaN as one pattern."""
    v = (nd.amp_cast(a, dtype='float32') if a.dtype != np.float32 else a).asnumpy()
    bits = v.view(np.uint32).copy()
    bits[np.isnan(v)] = 0x7FC00000
    return bits


def _adversarial(rng, shape):
    """float32 gradients over 20 decades, with inf, -inf, NaN, subnormals, +-0 and values
    whose product with rescale_grad overflows."""
    g = (rng.randn(*shape) * 10 ** rng.uniform(-10, 10, shape)).astype(np.float32).ravel()
    specials = [np.inf, -np.inf, np.nan, 1e-40, -1e-42, 0.0, -0.0, 3.4e38, -3.4e38]
    for k, v in enumerate(specials[:g.size]):
        g[(k * 7919) % g.size] = v
    return g.reshape(shape)


def _case(seed):
    rng = np.random.RandomState(seed)
    weights = [rng.randn(*s).astype(np.float32) for s in SHAPES]
    weights[1][:4] = [1e-41, -0.0, 0.0, 3e38]   # subnormal, signed zeros, near the top
    grads = [_adversarial(rng, s) for s in SHAPES]
    moms = [rng.randn(*s).astype(np.float32) for s in SHAPES]
    # learning rates over 6 decades (some MXNet's scalar parser rounds 1 ulp off float32)
    lrs = [float(10 ** rng.uniform(-6, 0)) for _ in SHAPES]
    wds = [float(10 ** rng.uniform(-6, -1)) if k % 3 else 0.0 for k in range(len(SHAPES))]
    return weights, grads, moms, lrs, wds


KWARGS = {
    'momentum': dict(momentum=0.9, rescale_grad=1 / 16.),
    'momentum_clip': dict(momentum=0.3141592653589793, rescale_grad=1 / 3., clip_gradient=0.5),
    'plain': dict(rescale_grad=0.1),
    'plain_clip': dict(rescale_grad=2.0, clip_gradient=1e-3),
}


@pytest.mark.parametrize('bfloat16_grads', [False, True], ids=['float32', 'bfloat16'])
@pytest.mark.parametrize('case', sorted(KWARGS))
@pytest.mark.parametrize('seed', [0, 1])
def test_one_pass_is_bit_identical_to_mxnets_kernel_per_weight(case, seed, bfloat16_grads):
    kwargs = KWARGS[case]
    momentum = 'momentum' in kwargs
    weights, grads, moms, lrs, wds = _case(seed)
    grads = [nd.array(g) for g in grads]
    if bfloat16_grads:   # MXNet's kernel gets their exact float32 values; targets written
        grads = [nd.amp_cast(g, dtype=BF16) for g in grads]
    targets = [k % 2 == 0 or bfloat16_grads for k in range(len(SHAPES))]
    ref_w, ref_m = [nd.array(w) for w in weights], [nd.array(m) for m in moms]
    for k, (w, g, m) in enumerate(zip(ref_w, grads, ref_m)):
        g32 = nd.amp_cast(g, dtype='float32')
        if momentum:
            nd.multi_sgd_mom_update(w, g32, m, out=[w], num_weights=1, lrs=(lrs[k],),
                                    wds=(wds[k],), **kwargs)
        else:
            nd.multi_sgd_update(w, g32, out=[w], num_weights=1, lrs=(lrs[k],), wds=(wds[k],),
                                **kwargs)
    ref_t = [nd.amp_cast(w, dtype=BF16) for w, t in zip(ref_w, targets) if t]

    got_w, got_m = [nd.array(w) for w in weights], [nd.array(m) for m in moms]
    got_t = [nd.zeros(s, dtype=BF16) for s, t in zip(SHAPES, targets) if t]
    inputs = []
    for w, g, m in zip(got_w, grads, got_m):
        inputs += [w, g, m] if momentum else [w, g]
    nd.mxmp_multi_sgd_update(  # pylint: disable=no-member
        *inputs, out=got_w + (got_m if momentum else []) + got_t, num_weights=len(SHAPES),
        lrs=tuple(lrs), wds=tuple(wds), with_momentum=int(momentum),
        targets=''.join('1' if t else '0' for t in targets), **kwargs)
    for got, want in zip(got_w + got_m + got_t, ref_w + ref_m + ref_t):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(_bits(got), _bits(want))
    assert np.isnan(got_w[0].asnumpy()).any()   # a NaN gradient reached its weight


def test_the_pass_refuses_outputs_that_are_not_its_inputs():
    w, g, m = nd.ones((4,)), nd.ones((4,)), nd.zeros((4,))
    with pytest.raises(mx.base.MXNetError, match='updates in place'):
        nd.mxmp_multi_sgd_update(w, g, m, out=[nd.ones((4,)), m], num_weights=1,  # noqa
                                 lrs=(0.1,), wds=(0.,), with_momentum=1, momentum=0.9)
        nd.waitall()   # the kernel's error comes with the engine's result
    with pytest.raises(mx.base.MXNetError, match='lrs.*tuple of num_weights=1'):
        nd.mxmp_multi_sgd_update(w, g, m, out=[w, m], num_weights=1,  # noqa
                                 lrs=(0.1, 0.2), wds=(0.,), with_momentum=1)
    with pytest.raises(mx.base.MXNetError, match="grad must be float32 or bfloat16"):
        nd.mxmp_multi_sgd_update(w, g.astype('float16'), m, out=[w, m], num_weights=1,  # noqa
                                 lrs=(0.1,), wds=(0.,), with_momentum=1)


def _train(cast_params, library, monkeypatch, optimizer_params, steps=6, overflow_at=None,
           multi_precision=False):
    """Parameters, master weights and momenta after ``steps`` steps of a converted bfloat16
    network with mxmp.Trainer, through the library's pass or MXNet's kernels."""
    monkeypatch.setattr(updater_module, 'library_update', lambda: library and library_update())
    mx.random.seed(3)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(40, activation='relu', in_units=12), gluon.nn.Dense(40000 // 40,
                                                                              in_units=40),
            gluon.nn.Dense(5, in_units=40000 // 40))
    net.initialize(mx.init.Xavier())
    net = mxmp.convert(net, 'bfloat16', cast_params=cast_params)
    net.hybridize()
    passes = []
    original = nd.mxmp_multi_sgd_update  # pylint: disable=no-member
    monkeypatch.setattr(nd, 'mxmp_multi_sgd_update',
                        lambda *a, **k: passes.append(1) or original(*a, **k))
    params = dict(optimizer_params, multi_precision=multi_precision)
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', params,
                           loss_scaler='dynamic' if overflow_at is not None else None)
    rng = np.random.RandomState(0)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(steps):
        x = rng.randn(8, 12) * (1e3 if step == 2 else 1.0)   # large: clipped gradients
        if step == overflow_at:
            x[0, 0] = np.inf
        y = nd.array(rng.randint(0, 5, 8))
        with autograd.record():
            loss = loss_fn(net(nd.array(x)), y)
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        trainer.step(8)
    # in the network's order (the Trainer sorts by name, and names count up across runs)
    out = []
    for p in net.collect_params().values():
        out.append(p.data())
        out += trainer.master_weights(p) if is_low_precision(p) else []
        state = trainer._updaters[0].states[trainer._param2idx[p.name]]
        out += [] if state is None else [state]
    assert len(passes) == (steps - (overflow_at is not None) if library else 0)
    return [_bits(a) for a in out], trainer


TRAIN_CASES = {   # factories: a scheduler is stateful, each run gets its own
    'momentum_wd_clip_schedule': lambda: dict(
        learning_rate=0.05, momentum=0.9, wd=1e-3, clip_gradient=0.05,
        lr_scheduler=mx.lr_scheduler.FactorScheduler(step=2, factor=0.5)),
    'no_momentum': lambda: dict(learning_rate=0.1, wd=1e-4),
}


@pytest.mark.parametrize('case', sorted(TRAIN_CASES))
@pytest.mark.parametrize('cast_params', [False, True], ids=['float32_params', 'cast_params'])
def test_trainer_through_the_library_equals_the_trainer_on_mxnets_kernels(
        case, cast_params, monkeypatch):
    ours, trainer = _train(cast_params, True, monkeypatch, TRAIN_CASES[case]())
    ref, _ = _train(cast_params, False, monkeypatch, TRAIN_CASES[case]())
    assert trainer._optimizer.num_update == 6
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('multi_precision', [False, True])
def test_an_overflowing_step_is_skipped_and_the_rest_match(monkeypatch, multi_precision):
    opts = TRAIN_CASES['momentum_wd_clip_schedule']
    with pytest.warns(mxmp.NonFiniteForwardWarning):   # the inf is in the input
        ours, trainer = _train(True, True, monkeypatch, opts(), overflow_at=3,
                               multi_precision=multi_precision)
    with pytest.warns(mxmp.NonFiniteForwardWarning):
        ref, ref_trainer = _train(True, False, monkeypatch, opts(), overflow_at=3,
                                  multi_precision=multi_precision)
    assert trainer.skipped_steps == ref_trainer.skipped_steps == 1
    assert trainer._optimizer.num_update == 5   # the skipped step counted no update
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('cast_params', [False, True], ids=['float32_params', 'cast_params'])
def test_module_through_the_library_equals_the_module_on_mxnets_kernels(cast_params,
                                                                        monkeypatch):
    from helpers import MODULE_BATCH, batch_of, bf16, mlp, np_params, problem, ready
    from mxmp._src.training.module import Module
    x, y = problem(4 * MODULE_BATCH, seed=2)
    results, passes = [], []
    original = nd.mxmp_multi_sgd_update  # pylint: disable=no-member
    monkeypatch.setattr(nd, 'mxmp_multi_sgd_update',
                        lambda *a, **k: passes.append(k['targets']) or original(*a, **k))
    for library in (True, False):
        monkeypatch.setattr(updater_module, 'library_update',
                            lambda lib=library: lib and library_update())
        mod = ready(Module(mlp(), cast_params=cast_params, **bf16()), lr=.05)
        for k in range(4):
            part = slice(k * MODULE_BATCH, (k + 1) * MODULE_BATCH)
            mod.forward_backward(batch_of(x[part], y[part]))
            assert mod.update()
        results.append(np_params(mod))
    # one pass per update, with the library only; with cast_params it writes bfloat16 weights
    assert len(passes) == 4 and all(('1' in t) == cast_params for t in passes)
    assert sorted(results[0]) == sorted(results[1])
    for name, value in results[0].items():
        np.testing.assert_array_equal(value.view(np.uint32), results[1][name].view(np.uint32))
