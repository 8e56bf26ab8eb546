"""Under gradient accumulation (several ``scale_loss`` calls, one step) the losses of every
micro-batch are checked: a NaN loss in an earlier micro-batch warns NonFiniteForwardWarning
on the skipped step and is named by LossScaleAtFloorError (only the last call's losses were
checked)."""
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp import DynamicLossScaler, LossScaleAtFloorError, NonFiniteForwardWarning


def accumulate(trainer, weight, batches):
    """One scale_loss/backward per micro-batch (grad_req='add'), one step."""
    for x in batches:
        with autograd.record():
            loss = (weight.data() * x).sum()
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()


def setup(scaler):
    weight = gluon.Parameter('w', shape=(4,), init=mx.init.One(), grad_req='add')
    weight.initialize()
    return weight, mxmp.Trainer([weight], 'sgd', {'learning_rate': 0.1}, loss_scaler=scaler)


@pytest.mark.parametrize('bad_at', [0, 1, 2])
def test_a_nan_loss_in_any_micro_batch_warns_that_the_forward_pass_was_not_finite(bad_at):
    weight, trainer = setup('dynamic')
    batches = [nd.ones((4,)) for _ in range(3)]
    batches[bad_at] = nd.array([1, np.nan, 1, 1])
    accumulate(trainer, weight, batches)
    with pytest.warns(NonFiniteForwardWarning):
        assert trainer.step(1) is False
    weight.zero_grad()
    accumulate(trainer, weight, [nd.ones((4,))] * 3)   # the flags were reset by the step
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        assert trainer.step(1) is True
    assert not [w for w in record if issubclass(w.category, NonFiniteForwardWarning)]


def test_the_floor_error_says_the_forward_pass_was_not_finite_for_an_early_micro_batch():
    weight, trainer = setup(DynamicLossScaler(init_scale=1.0, max_overflows_at_floor=1))
    accumulate(trainer, weight, [nd.array([np.inf, 1, 1, 1]), nd.ones((4,))])
    with pytest.warns(NonFiniteForwardWarning), \
            pytest.raises(LossScaleAtFloorError, match='forward pass itself was not finite'):
        trainer.step(1)


@pytest.mark.parametrize('bad_at', [0, 1])
def test_a_gluon_trainer_under_mxmp_amp_warns_for_any_micro_batch(bad_at):
    from mxmp import amp
    amp.disable()
    try:
        amp.init('float16')
        weight = gluon.Parameter('w', shape=(4,), init=mx.init.One(), grad_req='add')
        weight.initialize()
        trainer = gluon.Trainer([weight], 'sgd', {'learning_rate': 0.1})
        amp.init_trainer(trainer)
        for k in range(2):
            x = nd.array([1, np.nan, 1, 1]) if k == bad_at else nd.ones((4,))
            with autograd.record():
                loss = (weight.data() * x).sum()
                with amp.scale_loss(loss, trainer) as scaled:
                    scaled.backward()
        with pytest.warns(NonFiniteForwardWarning):
            trainer.step(1)
        assert np.array_equal(weight.data().asnumpy(), np.ones(4))   # skipped
    finally:
        amp.disable()
