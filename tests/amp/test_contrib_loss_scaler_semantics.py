"""contrib.amp's ``LossScaler`` semantics on an mxmp.amp ``gluon.Trainer``: every value
contrib.amp 1.9.1's fields take is taken (they are plain attributes there), the object pickles
both ways, and several losses in any sequence type (namedtuples included) are scaled, as a
list as contrib.amp's ``scale_loss`` returns. Differential against MXNet's own
``mxnet.contrib.amp.loss_scaler.LossScaler`` (constructed alone: ``amp.init`` of contrib.amp
is never called, it would patch MXNet's operators for the whole process)."""
import collections
import pickle

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.contrib.amp.loss_scaler import LossScaler as ContribLossScaler

from mxmp import amp
from mxmp._src.amp.loss_scaler import CONTRIB_FIELDS

Losses = collections.namedtuple('Losses', ['ce', 'aux'])


@pytest.fixture(autouse=True)
def fresh_amp():
    amp.disable()
    yield
    amp.disable()


def make(seed=0):
    """A float16-policy gluon.Trainer with mxmp.amp's scaler over one float32 Dense layer."""
    amp.init('float16')
    mx.random.seed(seed)
    net = gluon.nn.Dense(3, in_units=4)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    amp.init_trainer(trainer)
    return net, trainer


WRITES = {   # sequences of writes contrib.amp's object takes (each from a fresh scaler)
    'a scale below mxmp floor 1': [('_loss_scale', 0.5)],
    'a cap above the scale after a low scale': [('_loss_scale', 1024.0),
                                                ('_max_loss_scale', 2048.0)],
    'a cap below the current scale': [('_max_loss_scale', 1024.0)],
    'a scale above the cap': [('_loss_scale', 2.0 ** 30)],
    'a next scale below 1': [('_next_loss_scale', 0.125)],
    'a count at the interval': [('_unskipped', 2000)],
    'an interval at the count': [('_unskipped', 5), ('_scale_seq_len', 5)],
    'numpy numbers': [('_loss_scale', np.float32(256)), ('_unskipped', np.int64(3)),
                      ('_scale_seq_len', np.int32(7)), ('_max_loss_scale', np.float64(512))],
    'a tiny cap': [('_max_loss_scale', 0.25)],
    'a resume tuple': [('_loss_scale', 8.0), ('_next_loss_scale', 4.0), ('_unskipped', 11)],
}


@pytest.mark.parametrize('case', sorted(WRITES))
def test_every_write_contrib_amp_takes_is_taken_and_read_back(case):
    _, trainer = make()
    mine, theirs = trainer._amp_loss_scaler, ContribLossScaler()
    for name, value in WRITES[case]:
        setattr(mine, name, value)
        setattr(theirs, name, value)
        for field in CONTRIB_FIELDS:
            assert getattr(mine, field) == getattr(theirs, field), field
    assert mine.loss_scale == theirs.loss_scale


def test_a_written_scale_below_one_is_the_one_the_loss_is_multiplied_by():
    net, trainer = make()
    trainer._amp_loss_scaler._loss_scale = 0.5
    with autograd.record():
        loss = net(nd.ones((2, 4))).sum()
        with amp.scale_loss(loss, trainer) as scaled:
            assert scaled.asscalar() == np.float32(loss.asscalar()) * np.float32(0.5)
            scaled.backward()
    assert trainer._scale == 1.0 / 0.5


def _check(trainer, grads_finite, params):
    for p in params:
        p.grad()[:] = 1.0 if grads_finite else np.inf
    return trainer._amp_loss_scaler.has_overflow(params)


def test_the_schedule_follows_contrib_amp_one_step_earlier_through_writes():
    """After each overflow check, mxmp's scale for the next step (``_loss_scale``) is
    contrib.amp's (``_next_loss_scale``, which contrib.amp applies one update later: the
    documented lag), the count and the decision the same, through writes of every field."""
    net, trainer = make()
    params = list(net.collect_params().values())
    for p in params:
        p.data()   # initialised
    mine, theirs = trainer._amp_loss_scaler, ContribLossScaler()
    rng = np.random.RandomState(0)
    plan = [('_scale_seq_len', 3), ('_max_loss_scale', 2.0 ** 18), ('_next_loss_scale', 2.0 ** 20),
            ('_loss_scale', 3.0), ('_max_loss_scale', 2.0 ** 10), ('_scale_seq_len', 2)]
    for k in range(40):
        if k % 6 == 0 and plan:
            name, value = plan.pop(0)
            setattr(mine, name, value)
            setattr(theirs, name, value)
        finite = bool(rng.rand() > 0.3)
        got = _check(trainer, finite, params)
        want = _check_contrib(theirs, finite, params)
        assert got == want
        assert (mine._loss_scale, mine._unskipped) == (theirs._next_loss_scale,
                                                        theirs._unskipped), k
        assert mine._loss_scale >= 1.0   # mxmp's floor is not reached in this plan


def _check_contrib(scaler, finite, params):
    for p in params:
        p.grad()[:] = 1.0 if finite else np.inf
    return scaler.has_overflow(params)


def test_the_scaler_pickles_and_the_copy_continues_the_same_schedule():
    net, trainer = make()
    scaler = trainer._amp_loss_scaler
    scaler._scale_seq_len, scaler._loss_scale, scaler._unskipped = 2, 0.5, 1
    scaler._next_loss_scale = 64.0
    copy = pickle.loads(pickle.dumps(scaler))
    assert type(copy) is type(scaler)
    assert [getattr(copy, f) for f in CONTRIB_FIELDS] == [getattr(scaler, f)
                                                          for f in CONTRIB_FIELDS]
    params = list(net.collect_params().values())
    for finite in [True, True, False, True, True, True]:
        assert _check(trainer, finite, params) == copy.has_overflow(params)
        assert [getattr(copy, f) for f in CONTRIB_FIELDS] == [getattr(scaler, f)
                                                              for f in CONTRIB_FIELDS]


def test_contrib_amps_pickled_scaler_fields_load_into_mxmps_and_back():
    theirs = ContribLossScaler()
    theirs._loss_scale, theirs._next_loss_scale, theirs._unskipped = 0.25, 0.5, 7
    theirs._scale_seq_len, theirs._max_loss_scale = 9, 1024.0
    theirs = pickle.loads(pickle.dumps(theirs))
    _, trainer = make()
    mine = trainer._amp_loss_scaler
    for field in CONTRIB_FIELDS:
        setattr(mine, field, getattr(theirs, field))
    back = pickle.loads(pickle.dumps(ContribLossScaler()))
    for field in CONTRIB_FIELDS:
        setattr(back, field, getattr(pickle.loads(pickle.dumps(mine)), field))
    assert [getattr(back, f) for f in CONTRIB_FIELDS] == [getattr(theirs, f)
                                                          for f in CONTRIB_FIELDS]


@pytest.mark.parametrize('make_losses', [
    lambda a, b: Losses(a, b), lambda a, b: (a, b), lambda a, b: [a, b],
    lambda a, b: Losses(a, [b, b])])
@pytest.mark.parametrize('native', [False, True])
def test_several_losses_in_any_sequence_are_scaled_as_a_list(make_losses, native):
    net, trainer = make()
    if native:
        import mxmp
        trainer = mxmp.Trainer(net.collect_params(), 'sgd', loss_scaler=8.0)
    scale = 8.0 if native else trainer._amp_loss_scaler.loss_scale
    with autograd.record():
        out = net(nd.ones((2, 4)))
        losses = make_losses(out.sum(), (out * out).sum())
        with amp.scale_loss(losses, trainer) as scaled:
            assert isinstance(scaled, list) and len(scaled) == 2
            flat = [scaled[0]] + (scaled[1] if isinstance(scaled[1], list) else [scaled[1]])
            want = [losses[0]] + (list(losses[1]) if isinstance(losses[1], list)
                                  else [losses[1]])
            for got, loss in zip(flat, want):
                assert got.asscalar() == np.float32(loss.asscalar()) * np.float32(scale)
            autograd.backward(flat)
    assert trainer.step(2) in (True, None)


def test_init_trainer_with_sparse_weights_names_mxmp_trainer_and_mxmp_trainer_steps():
    """gluon updates sparse weights on the kvstore during the push, before an overflow check:
    init_trainer refuses with the fix (it set update_on_kvstore=False, which gluon then refused
    at the first step, blaming the user); mxmp.Trainer with amp.scale_loss steps."""
    amp.init('float16')
    refused = gluon.Parameter('emb', shape=(6, 2), stype='row_sparse', grad_stype='row_sparse')
    refused.initialize(mx.init.One())
    with pytest.raises(ValueError, match='mxmp.Trainer'):
        amp.init_trainer(gluon.Trainer([refused], 'sgd'))
    import mxmp
    weight = gluon.Parameter('emb', shape=(6, 2), stype='row_sparse', grad_stype='row_sparse')
    weight.initialize()   # a new Parameter: gluon allows one Trainer per row_sparse one
    weight.set_data(nd.ones((6, 2)).tostype('row_sparse'))
    trainer = mxmp.Trainer([weight], 'sgd', {'learning_rate': 1.0}, loss_scaler='dynamic')
    rows, mask = nd.array([1, 4]), nd.array([[0, 0], [1, 1], [0, 0], [0, 0], [1, 1], [0, 0]])
    with autograd.record():
        loss = (weight.row_sparse_data(rows) * mask).sum()   # gradient 1 on rows 1 and 4
        with amp.scale_loss(loss, trainer) as scaled:
            scaled.backward()
    assert trainer.step(1) is True
    got = weight.row_sparse_data(nd.arange(6)).asnumpy()
    assert np.array_equal(got[:, 0], [1, 0, 1, 1, 0, 1])
