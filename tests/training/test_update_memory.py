"""The master-weight update runs in groups (``mxmp._src.training.step.update_groups``): the
float32 copies of the low-precision gradients of one group exist at a time, and the result is
bit-identical to one optimizer call over all weights (the update before the grouping). SGD with
mxmp's library makes no copies at all: one pass reads the bfloat16 gradients and writes masters,
momentum and bfloat16 weights (``Updater.update_with_targets``), with the same numbers.

The allocation pattern is pinned with MXNet's own allocation counts (``mx.profiler`` memory
profile, exact bytes, the same on every CPU), in a subprocess because the profiler is
process-wide state. Measured with 16 bfloat16 Dense layers of 512 x 512 (float32 gradient copies:
16 x 1050.6 kB): the update allocates 4202.5 kB (one group of 8 Parameters, 4 layers), against
16810 kB when every copy was made before the optimizer call.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd

from mxmp._src.dtypes import dtype_name, mx_dtype
from mxmp._src.scaling import DynamicLossScaler, NoOpLossScaler
from mxmp._src.training.step import UPDATE_GROUP, Step, device_update, update_groups
from mxmp._src.training import updater as updater_module
from mxmp._src.training.updater import Updater, library_update

BF16 = mx_dtype('bfloat16')
REPO = Path(__file__).resolve().parents[2]
SHAPES = [(17, 5), (17,), (4, 3, 3), (9,), (33, 2), (6,), (5, 5), (5,), (12, 7), (12,),
          (3, 3, 3), (2,), (40,)]   # 13 weights: two groups of 8 and a partial one


def _bf16(a):
    return nd.amp_cast(nd.array(a), dtype=BF16)


def _data(seed):
    """(bfloat16 weights, float32 masters, bfloat16 gradients) over SHAPES."""
    rng = np.random.RandomState(seed)
    masters = [nd.array(rng.randn(*s)) for s in SHAPES]
    weights = [nd.amp_cast(m, dtype=BF16) for m in masters]
    grads = [[_bf16(rng.randn(*s) * 10 ** rng.uniform(-3, 1)) for s in SHAPES]
             for _ in range(3)]
    return weights, masters, grads


OPTIMIZERS = {
    'sgd_momentum_wd': lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3,
                                                rescale_grad=0.5),
    'sgd_scheduled': lambda: mx.optimizer.SGD(
        learning_rate=0.2, momentum=0.5, clip_gradient=1.0,
        lr_scheduler=mx.lr_scheduler.FactorScheduler(step=1, factor=0.7)),
    'adam': lambda: mx.optimizer.Adam(learning_rate=0.01, wd=1e-4),
}


@pytest.mark.parametrize('path', ['library', 'mxnet_kernel'])
@pytest.mark.parametrize('name', sorted(OPTIMIZERS))
def test_the_grouped_update_is_bit_identical_to_one_optimizer_call(name, path, monkeypatch):
    if path == 'library' and not library_update():
        pytest.skip("mxmp's operator library does not build here")
    if path == 'mxnet_kernel':
        monkeypatch.setattr(updater_module, 'library_update', lambda: False)
    fused = []
    original = Updater.update_with_targets
    monkeypatch.setattr(Updater, 'update_with_targets',
                        lambda self, *a: fused.append(original(self, *a)) or fused[-1])
    weights, masters, grads = _data(0)
    ref_masters = [m.copy() for m in masters]
    ref_weights = [w.copy() for w in weights]
    ref_opt = OPTIMIZERS[name]()
    ref = mx.optimizer.get_updater(ref_opt)   # MXNet's Updater, all weights in one call
    opt = OPTIMIZERS[name]()
    updater = Updater(opt)
    step = Step(NoOpLossScaler())
    indices = list(range(len(SHAPES)))
    for k in range(3):
        ref(indices, [nd.amp_cast(g, dtype='float32') for g in grads[k]], ref_masters)
        for m, w in zip(ref_masters, ref_weights):
            nd.amp_cast(m, dtype=BF16, out=w)
        update = device_update(list(zip(indices, weights, grads[k], masters)))
        parts = update_groups(updater, update)
        assert len(parts) == 2 if name.startswith('sgd') else 3   # SGD: chunks of 4 -> 8
        assert step.apply([(updater, update)], opt, ref_opt.rescale_grad) is True
    for got, want in zip(masters + weights, ref_masters + ref_weights):
        assert dtype_name(got.dtype) == dtype_name(want.dtype)
        assert np.array_equal(nd.amp_cast(got, dtype='float32').asnumpy(),
                              nd.amp_cast(want, dtype='float32').asnumpy())
    assert not np.array_equal(masters[0].asnumpy(), _data(0)[1][0].asnumpy())   # it moved
    # SGD through the library: one pass per step; else the groups
    assert fused == [path == 'library' and name.startswith('sgd')] * 3


def test_one_call_when_nothing_is_cast_or_the_weights_mix_dtypes():
    opt = mx.optimizer.SGD(learning_rate=0.1)
    updater = Updater(opt)
    plain = device_update([(i, nd.ones((3,)), nd.ones((3,)), None) for i in range(20)])
    assert update_groups(updater, plain) == [slice(0, 20)]
    mixed = device_update([(i, _bf16(np.ones(3)), _bf16(np.ones(3)), nd.ones((3,)))
                           for i in range(10)] +
                          [(10, nd.ones((3,), dtype='float64'), nd.ones((3,), dtype='float64'),
                            None)])
    assert update_groups(updater, mixed) == [slice(0, 11)]
    assert UPDATE_GROUP == 8


def test_an_overflow_in_a_bfloat16_gradient_of_a_later_group_skips_every_group():
    weights, masters, grads = _data(1)
    before = [m.asnumpy().copy() for m in masters]
    grads[0][-1] = _bf16(np.full(SHAPES[-1], np.inf))   # the last group only
    opt = mx.optimizer.SGD(learning_rate=0.1)
    step = Step(DynamicLossScaler(init_scale=8.0))
    update = device_update(list(zip(range(len(SHAPES)), weights, grads[0], masters)))
    assert step.apply([(Updater(opt), update)], opt, 1.0) is False
    assert step.scaler.scale == 4.0
    assert all(np.array_equal(m.asnumpy(), b) for m, b in zip(masters, before))


PROBE = textwrap.dedent('''
    import os, sys
    import mxnet as mx
    import mxmp
    from mxnet import autograd
    from mxnet.gluon import nn
    mx.profiler.set_config(profile_memory=True, aggregate_stats=True, profile_all=False,
                           profile_symbolic=False, profile_imperative=False,
                           profile_api=False, filename=os.path.join(sys.argv[1], 'trace.json'))
    mx.random.seed(0)
    net = nn.HybridSequential()
    for _ in range(16):
        net.add(nn.Dense(512, flatten=False, in_units=512))
    net.initialize()
    net = mxmp.convert(net, 'bfloat16', cast_params=True, emulate=True)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1, 'momentum': 0.9})
    x = mx.nd.ones((4, 512))
    for k in range(2):   # the second step's update alone is measured (states exist by then)
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        mx.nd.waitall()
        if k == 1:
            mx.profiler.set_state('run')
        trainer.step(1)
        mx.nd.waitall()
    mx.profiler.set_state('stop')
    rows = [l.split() for l in mx.profiler.dumps().splitlines() if 'Memory: cpu/0' in l]
    grads = sorted({mxmp._src.dtypes.dtype_name(p.grad().dtype)
                    for p in net.collect_params().values()})
    print('PEAK_KB', float(rows[0][4]) if rows else 0.0, ','.join(grads))
''')


@pytest.mark.parametrize('kernels', ['library', 'mxnet'])
def test_the_update_holds_the_float32_gradient_copies_of_one_group_at_a_time(tmp_path, kernels):
    if kernels == 'library' and not library_update():
        pytest.skip("mxmp's operator library does not build here")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
               OMP_NUM_THREADS='1')
    if kernels == 'mxnet':
        env['MXMP_KERNELS'] = 'mxnet'   # no library: MXNet's kernel on float32 copies
    proc = subprocess.run([sys.executable, '-c', PROBE, str(tmp_path)], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, peak_kb, grads = proc.stdout.strip().splitlines()[-1].split()
    assert grads == 'bfloat16'   # every gradient needs a float32 copy for its master
    if kernels == 'library':
        # the library's one pass reads the bfloat16 gradients: the update allocates nothing
        assert float(peak_kb) == 0.0, peak_kb
        return
    layer_kb = (512 * 512 + 512) * 4 / 1000.0   # one layer's float32 gradient copies (the
    # profiler's kB are 1000 bytes); a group of UPDATE_GROUP Parameters is 4 layers
    # measured: exactly one group's buffer, 4202.50 kB, in 5 of 5 runs; before the grouping all
    # 16 layers' copies at once (16809.98 kB); groups of new arrays instead of one reused
    # buffer: 8404.99 kB (two groups) in some runs, 16809.98 in others
    assert abs(float(peak_kb) - UPDATE_GROUP // 2 * layer_kb) < 1.0, peak_kb


REGISTRY = sorted(set(mx.optimizer.Optimizer.opt_registry) - {'test'})   # 'test': a stub
OPTIONS = {'lbsgd': dict(batch_scale=2, warmup_epochs=0)}   # accumulates over 2 calls


@pytest.mark.parametrize('name', REGISTRY)
def test_every_mxnet_optimizer_gives_one_calls_result_grouped_or_ungrouped(name):
    """Grouped (one reused float32 buffer) against MXNet's Updater in one call, 13 bfloat16
    weights, 3 steps. LBSGD keeps ``cum_grad = grad`` between calls: grouped, the next group
    overwrote it (max difference 0.03 here, 0.12 in the issue's case), so it gets one call."""
    rng = np.random.RandomState(0)
    shapes = [(5, 3)] * 6 + [(2, 7)] * 7   # GroupAdaGrad takes 2-D weights only
    masters = [nd.array(rng.randn(*s)) for s in shapes]
    weights = [nd.amp_cast(m, dtype=BF16) for m in masters]
    grads = [[_bf16(rng.randn(*s)) for s in shapes] for _ in range(3)]
    ref_masters = [m.copy() for m in masters]
    make = lambda: mx.optimizer.create(name, learning_rate=0.01,  # noqa: E731
                                       **OPTIONS.get(name, {}))
    ref_opt, opt = make(), make()
    ref, updater = mx.optimizer.get_updater(ref_opt), Updater(opt)
    step = Step(NoOpLossScaler())
    indices = list(range(len(shapes)))
    for k in range(3):
        mx.random.seed(k)   # SGLD draws noise
        ref(indices, [nd.amp_cast(g, dtype='float32') for g in grads[k]], ref_masters)
        update = device_update(list(zip(indices, weights, grads[k], masters)))
        grouped = len(update_groups(updater, update)) > 1
        mx.random.seed(k)
        assert step.apply([(updater, update)], opt, ref_opt.rescale_grad) is True
    assert grouped is not (name in ('lbsgd', 'lamb'))   # LAMB: one chunk of aggregate_num
    for got, want in zip(masters, ref_masters):
        assert np.array_equal(got.asnumpy(), want.asnumpy())
    assert not np.array_equal(masters[0].asnumpy(), _data(0)[1][0].asnumpy())
