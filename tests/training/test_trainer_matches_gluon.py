"""Differential suite: mxmp.Trainer against gluon.Trainer, the reference wherever mxmp claims
to behave like it. float32 Parameters: weights bit for bit. float16/bfloat16 Parameters: the
float32 master weights bit for bit against a float32 gluon.Trainer fed the same rounded
gradients (and the weights equal to the masters rounded), through optimizers, multipliers,
schedulers, two devices, sparse gradients and sparse weights, grad_req changes, Parameters
shared by two Trainers, set_data, and save/load across freezing.

The gradients are chosen (``G``, |G| in [1e-3, 1]) and put in by backward of
``sum(weight * G)``: a low-precision weight's gradient is ``G`` rounded to its dtype (float16
times the loss scale 2**8 and divided again: exact for a power of two in the normal range), the
reference is fed exactly that rounded value in float32."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp import NonFiniteForwardWarning
from mxmp._src.dtypes import dtype_name, mx_dtype
from mxmp._src.scaling import DynamicLossScaler

DTYPES = ['float32', 'float16', 'bfloat16']
SHAPES = {'a': (5, 3), 'b': (3,), 'c': (4, 2)}


def f32(array):
    return nd.amp_cast(array, dtype='float32').asnumpy()


def rounded(values, dtype):
    """float32 numpy ``values`` rounded to ``dtype`` (round to nearest even, as amp_cast)."""
    if dtype == 'float32':
        return np.asarray(values, np.float32)
    return f32(nd.amp_cast(nd.array(values), dtype=mx_dtype(dtype)))


def gradient(rng, shape):
    return (rng.choice([-1, 1], shape) * rng.uniform(1e-3, 1, shape)).astype(np.float32)


class Pair:
    """Parameters of one dtype for mxmp.Trainer (``mine``) and float32 ones for gluon.Trainer
    (``ref``) with equal values (random, rounded to the dtype), by name."""

    def __init__(self, dtype, shapes=SHAPES, seed=0, ctx=None, stypes=None):
        self.dtype, self.ctx = dtype, ctx or [mx.cpu()]
        rng = np.random.RandomState(seed)
        self.mine, self.ref = {}, {}
        for name, shape in shapes.items():
            value = rounded(rng.randn(*shape), dtype)
            stype, grad_stype = (stypes or {}).get(name, ('default', 'default'))
            for table in (self.mine, self.ref):
                p = gluon.Parameter(name, shape=shape, init=mx.init.Zero(), stype=stype,
                                    grad_stype=grad_stype)
                p.initialize(ctx=self.ctx)
                p.set_data(nd.array(value).tostype(stype))
                table[name] = p
            if dtype != 'float32':
                self.mine[name].cast(mx_dtype(dtype))

    def trainers(self, optimizer, opt_params, names=None, **kwargs):
        names = names or list(self.mine)
        scaler = DynamicLossScaler(init_scale=2.0 ** 8) if self.dtype == 'float16' else None
        mine = mxmp.Trainer([self.mine[n] for n in names], optimizer, dict(opt_params),
                            loss_scaler=scaler, **kwargs)
        ref = gluon.Trainer([self.ref[n] for n in names], optimizer, dict(opt_params), **kwargs)
        return mine, ref

    def feed(self, trainer, ref_trainer, grads):
        """Backward of sum(weight * G) on both sides (per device: G, 2G, ...); the reference
        gets G rounded to the dtype."""
        for side, params in (('mine', self.mine), ('ref', self.ref)):
            with autograd.record():
                terms = []
                for k, ctx in enumerate(self.ctx):
                    for name, g in grads.items():
                        g = rounded(g * (k + 1), self.dtype)
                        data = params[name].data(ctx) if params[name]._stype == 'default' \
                            else None
                        if data is None:   # a sparse weight: only its pulled rows are used
                            rows = nd.array(np.flatnonzero(np.abs(g).sum(1)), ctx=ctx)
                            data = params[name].row_sparse_data(rows)
                        terms.append((data.astype('float32') * nd.array(g, ctx=ctx))
                                     .sum().as_in_context(self.ctx[0]))
                loss = nd.add_n(*terms) if len(terms) > 1 else terms[0]
                if side == 'mine':
                    with trainer.scale_loss(loss) as scaled:
                        scaled.backward()
                else:
                    loss.backward()

    def assert_match(self, trainer, names=None):
        for name in names or self.mine:
            mine, ref = self.mine[name], self.ref[name]
            if mine._stype != 'default':
                rows = nd.arange(mine.shape[0])
                got, want = f32(mine.row_sparse_data(rows)), f32(ref.row_sparse_data(rows))
                assert np.array_equal(got, want), name
                continue
            for k, ctx in enumerate(self.ctx):
                want = ref.data(ctx).asnumpy()
                assert dtype_name(mine.data(ctx).dtype) == self.dtype
                if self.dtype != 'float32' and mine.grad_req != 'null':
                    master = trainer.master_weights(mine)[k].asnumpy()
                    assert np.array_equal(master, want), (name, k, np.abs(master - want).max())
                assert np.array_equal(f32(mine.data(ctx)), rounded(want, self.dtype)), (name, k)


def run(pair, mine, ref, steps, rng, batch=3, names=None, shapes=None):
    names = names or [p.name for p in mine._params]
    for _ in range(steps):
        grads = {n: gradient(rng, (shapes or SHAPES)[n]) for n in names
                 if pair.mine[n].grad_req != 'null'}
        pair.feed(mine, ref, grads)
        assert mine.step(batch) is True
        ref.step(batch)


OPTIMIZERS = {
    'sgd': ('sgd', {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-2, 'clip_gradient': 0.5,
                    'lr_scheduler': mx.lr_scheduler.FactorScheduler(step=1, factor=0.8)}),
    'adam': ('adam', {'learning_rate': 0.01, 'wd': 1e-3}),
    'nag': ('nag', {'learning_rate': 0.1, 'momentum': 0.9}),
    'rmsprop': ('rmsprop', {'learning_rate': 0.01, 'centered': True}),
    'lamb': ('lamb', {'learning_rate': 0.01, 'wd': 1e-3}),
    'lars': ('lars', {'learning_rate': 0.1, 'momentum': 0.9}),
    'ftml': ('ftml', {'learning_rate': 0.01}),
    'adagrad': ('adagrad', {'learning_rate': 0.1}),
    'signum': ('signum', {'learning_rate': 0.01, 'momentum': 0.9}),
}


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('name', sorted(OPTIMIZERS))
def test_optimizers_schedulers_and_multipliers(dtype, name):
    optimizer, params = OPTIMIZERS[name]
    if name == 'sgd':   # a scheduler object is stateful: one per Trainer
        params = dict(params, lr_scheduler=mx.lr_scheduler.FactorScheduler(step=1, factor=0.8))
    pair = Pair(dtype)
    for table in (pair.mine, pair.ref):
        table['b'].lr_mult, table['b'].wd_mult = 0.5, 0.0
    mine, ref = pair.trainers(optimizer, params)
    if name == 'sgd':
        ref._optimizer.lr_scheduler = mx.lr_scheduler.FactorScheduler(step=1, factor=0.8)
        ref._optimizer.lr_scheduler.base_lr = 0.1
    run(pair, mine, ref, 4, np.random.RandomState(1))
    pair.assert_match(mine)


def test_two_devices_float32():
    pair = Pair('float32', ctx=[mx.cpu(0), mx.cpu(1)])
    mine, ref = pair.trainers('sgd', {'learning_rate': 0.1, 'momentum': 0.9})
    run(pair, mine, ref, 3, np.random.RandomState(2))
    pair.assert_match(mine)


@pytest.mark.parametrize('dtype', DTYPES)
def test_grad_req_changes(dtype):
    pair = Pair(dtype)
    mine, ref = pair.trainers('adam', {'learning_rate': 0.01})
    rng = np.random.RandomState(3)
    run(pair, mine, ref, 2, rng)
    for table in (pair.mine, pair.ref):
        table['a'].grad_req = 'null'
    run(pair, mine, ref, 2, rng)
    for table in (pair.mine, pair.ref):
        table['a'].grad_req = 'write'
    run(pair, mine, ref, 2, rng)
    pair.assert_match(mine)


@pytest.mark.parametrize('dtype', DTYPES)
def test_a_parameter_shared_by_two_trainers(dtype):
    """The issue's case: two Trainers over one Parameter each kept a stale master (three
    rounds of gradient 1 at learning rate 1: -6 in float32, -4 with float16 masters)."""
    pair = Pair(dtype)
    first, ref_first = pair.trainers('sgd', {'learning_rate': 0.1, 'momentum': 0.5},
                                     names=['a', 'b'])
    second, ref_second = pair.trainers('adam', {'learning_rate': 0.01}, names=['b', 'c'])
    rng = np.random.RandomState(4)
    for _ in range(3):
        run(pair, first, ref_first, 1, rng, names=['a', 'b'])
        run(pair, second, ref_second, 1, rng, names=['b', 'c'])
    pair.assert_match(first, ['a', 'b'])
    pair.assert_match(second, ['b', 'c'])


@pytest.mark.parametrize('dtype', DTYPES)
def test_set_data_is_what_the_next_step_updates(dtype):
    """The issue's case: after set_data(5) a step at learning rate 0 put the weight back."""
    pair = Pair(dtype)
    mine, ref = pair.trainers('sgd', {'learning_rate': 0.1, 'wd': 0.01})
    rng = np.random.RandomState(5)
    run(pair, mine, ref, 2, rng)
    value = rounded(np.random.RandomState(6).randn(*SHAPES['a']) * 5, dtype)
    for table in (pair.mine, pair.ref):
        table['a'].set_data(nd.array(value).astype(table['a'].dtype)
                            if dtype != 'bfloat16' or table is pair.ref
                            else nd.amp_cast(nd.array(value), dtype=mx_dtype(dtype)))
    mine._optimizer.set_learning_rate(0.0)
    ref._optimizer.set_learning_rate(0.0)
    run(pair, mine, ref, 1, rng)
    assert np.array_equal(f32(pair.mine['a'].data()), value)
    mine._optimizer.set_learning_rate(0.1)
    ref._optimizer.set_learning_rate(0.1)
    run(pair, mine, ref, 2, rng)
    pair.assert_match(mine)


@pytest.mark.parametrize('dtype', DTYPES)
@pytest.mark.parametrize('frozen_when', ['saved', 'loaded'])
def test_save_and_load_across_freezing(dtype, frozen_when, tmp_path):
    """The issue's case: saved with a Parameter frozen, loaded after unfreezing: "Parameter 0
    (a) is bfloat16 in the file but bfloat16 here"; gluon.Trainer loads it."""
    pair = Pair(dtype)
    mine, ref = pair.trainers('adam', {'learning_rate': 0.01})
    rng = np.random.RandomState(7)
    run(pair, mine, ref, 2, rng)
    if frozen_when == 'saved':
        for table in (pair.mine, pair.ref):
            table['a'].grad_req = 'null'
        run(pair, mine, ref, 1, rng)
    mine.save_states(str(tmp_path / 'mine.states'))
    ref.save_states(str(tmp_path / 'ref.states'))
    for table in (pair.mine, pair.ref):
        table['a'].grad_req = 'write' if frozen_when == 'saved' else 'null'
    mine, ref = pair.trainers('adam', {'learning_rate': 0.01})
    mine.load_states(str(tmp_path / 'mine.states'))
    ref.load_states(str(tmp_path / 'ref.states'))
    run(pair, mine, ref, 1, rng)
    for table in (pair.mine, pair.ref):
        table['a'].grad_req = 'write'
    run(pair, mine, ref, 2, rng)
    pair.assert_match(mine)


SPARSE_SHAPES = {'e': (10, 3), 'b': (3,)}


def _sparse_rows(rng, shape, k):
    g = np.zeros(shape, np.float32)
    rows = rng.choice(shape[0], 3, replace=False)
    g[rows] = gradient(rng, (3, shape[1]))
    return g


@pytest.mark.parametrize('dtype', ['float32', 'float16'])   # MXNet has no row_sparse bfloat16
@pytest.mark.parametrize('optimizer, params', [
    ('sgd', {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 0.1}),
    ('adam', {'learning_rate': 0.01, 'wd': 0.1})])
def test_sparse_gradients_update_only_their_rows(dtype, optimizer, params):
    """The issue's case: a float16 row_sparse gradient was made dense, and weight decay and
    momentum reached the rows outside the batch (0.9712 where float32 keeps 1.0)."""
    pair = Pair(dtype, SPARSE_SHAPES, stypes={'e': ('default', 'row_sparse')})
    mine, ref = pair.trainers(optimizer, params)
    rng = np.random.RandomState(8)
    before = f32(pair.mine['e'].data())
    touched = set()
    for k in range(3):
        grads = {'e': _sparse_rows(rng, SPARSE_SHAPES['e'], k),
                 'b': gradient(rng, SPARSE_SHAPES['b'])}
        touched |= set(np.flatnonzero(np.abs(grads['e']).sum(1)))
        _sparse_feed(pair, mine, ref, grads)
        assert mine.step(2) is True
        ref.step(2)
    pair.assert_match(mine)
    untouched = sorted(set(range(10)) - touched)
    assert untouched and np.array_equal(f32(pair.mine['e'].data())[untouched],
                                        before[untouched])


def _sparse_feed(pair, mine, ref, grads):
    """The gradients written as backward leaves them (MXNet's CPU Embedding has no float16
    sparse backward): a row_sparse gradient of the rows used, times the loss scale on
    mxmp's side, and the fresh-gradient flag backward sets."""
    rows = np.flatnonzero(np.abs(grads['e']).sum(1))
    for side, params in (('mine', pair.mine), ('ref', pair.ref)):
        scale = mine.loss_scale if side == 'mine' else 1.0
        for name in ('e', 'b'):
            param = params[name]
            g = rounded(grads[name], pair.dtype) * scale
            if name == 'e':
                value = nd.sparse.row_sparse_array((g[rows], rows), shape=g.shape)
                value.astype(param.dtype).copyto(param.grad())
                assert param.grad().stype == 'row_sparse'
            else:
                param.grad()[:] = nd.array(g).astype(param.dtype)
            param.data()._fresh_grad = True   # what backward sets


@pytest.mark.parametrize('optimizer, params', [
    ('sgd', {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 0.1}),
    ('adam', {'learning_rate': 0.01})])
def test_sparse_weights_step_as_gluon_on_the_kvstore(optimizer, params, tmp_path):
    """The issue's case: mxmp forced update_on_kvstore=False, which gluon refuses with sparse
    weights ("Cannot set update_on_kvstore=False when sparse weights are present")."""
    stypes = {'e': ('row_sparse', 'row_sparse')}
    pair = Pair('float32', SPARSE_SHAPES, stypes=stypes)
    mine, ref = pair.trainers(optimizer, params)
    rng = np.random.RandomState(9)
    for k in range(4):
        grads = {'e': _sparse_rows(rng, SPARSE_SHAPES['e'], k),
                 'b': gradient(rng, SPARSE_SHAPES['b'])}
        pair.feed(mine, ref, grads)
        assert mine.step(2) is True
        ref.step(2)
        if k == 1:
            mine.save_states(str(tmp_path / 'mine'))
            ref.save_states(str(tmp_path / 'ref'))
            mine.load_states(str(tmp_path / 'mine'))
            ref.load_states(str(tmp_path / 'ref'))
    pair.assert_match(mine)


def test_sparse_weights_skip_an_overflowing_step_before_the_kvstore_updates():
    pair = Pair('float32', SPARSE_SHAPES, stypes={'e': ('row_sparse', 'row_sparse')})
    mine = mxmp.Trainer(list(pair.mine.values()), 'sgd', {'learning_rate': 0.1},
                        loss_scaler='dynamic')
    grads = {'e': _sparse_rows(np.random.RandomState(10), SPARSE_SHAPES['e'], 0),
             'b': np.full(SPARSE_SHAPES['b'], np.inf, np.float32)}
    before = f32(pair.mine['e'].row_sparse_data(nd.arange(10)))
    pair.feed(mine, gluon.Trainer(list(pair.ref.values()), 'sgd'), grads)
    with pytest.warns(NonFiniteForwardWarning):   # the loss is inf too
        assert mine.step(1) is False
    assert mine.loss_scale == 2.0 ** 15
    assert np.array_equal(f32(pair.mine['e'].row_sparse_data(nd.arange(10))), before)


def test_sparse_weights_with_low_precision_parameters_are_refused_naming_both():
    pair = Pair('float16', SPARSE_SHAPES)
    sparse = gluon.Parameter('s', shape=(10, 3), stype='row_sparse', grad_stype='row_sparse')
    sparse.initialize()
    with pytest.raises(ValueError, match=r'sparse.*\bs\b.*float16/bfloat16.*\be\b'):
        mxmp.Trainer([sparse] + list(pair.mine.values()), 'sgd')
