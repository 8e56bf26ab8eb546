"""The optimizer's updater of mxmp's Trainer and Module: SGD on a CPU updates one array per call.

``mx.optimizer.SGD`` updates dense weights with MXNet's aggregated kernels
(``multi_sgd_mom_update``, ``multi_sgd_update``), ``MXNET_OPTIMIZER_AGGREGATION_SIZE`` (default
4) weights per call. On a CPU the aggregated kernel's time grows with the number of weights in a
call times the largest of them, so the same kernel called with one weight at a time is faster,
with the same numbers. Measured on MXNet 1.9.1 (AMD EPYC Zen 4) with ``OMP_NUM_THREADS=T python -m
benchmarks.optimizer_update`` (ResNet-50's 193 float32 weight arrays, 25.6 M values; median of
5 calls per variant; three runs at T=1, one at T=2):

* ``multi_sgd_mom_update``, 4 weights per call (MXNet's default): 162.1 / 93.6 / 132.2 ms at
  T=1, 130.0 at T=2;
* ``multi_sgd_mom_update``, 1 weight per call (this updater): 61.3 / 65.0 / 63.3 ms, 83.1;
  bit-identical to the default in every run;
* ``sgd_mom_update``, one weight per call: 59.2 / 35.5 / 37.8 ms, 54.6. Faster still, but not
  used: it reads ``lr`` and ``wd`` as scalar parameters through a float parser that is not
  correctly rounded and lands one float32 ulp away for some values (the script counts 175 of
  2,000 random learning rates in [1e-6, 1], and 0 for the aggregated kernel's ``lrs``; 0.1,
  0.01 and 1e-4 parse exactly); with the script's learning rate its results differ from the
  default's in every run.

:class:`Updater` is ``mx.optimizer.Updater`` that, for an ``mx.optimizer.SGD`` (exactly that
class: a subclass may change the update) whose weights and gradients are dense float32 arrays on
a CPU, does what MXNet's Updater and ``SGD._update_impl`` do (states created on first use, the
update counted for each chunk of ``aggregate_num`` weights before that chunk's learning rates
are read, so schedulers and stale parameters see the same step, ``lr_mult``/``wd_mult``,
``rescale_grad``, ``momentum``, ``clip_gradient``), and then calls the aggregated kernel once per
weight. Every other case (GPUs, other optimizers, float16 weights with ``multi_precision``,
sparse arrays) goes to ``mx.optimizer.Updater`` unchanged. Its states, ``get_states`` and
``set_states`` are the base class's, so state files load either way.
"""
import numpy as np
import mxnet as mx
from mxnet import nd

__all__ = ['Updater', 'runs_single_array']


def runs_single_array(optimizer, weights, grads):
    """bool: whether :class:`Updater` updates these one weight per kernel call.

    Args:
        optimizer (mx.optimizer.Optimizer): the updater's optimizer.
        weights, grads (list of NDArray): the arrays of one updater call.

    True when ``type(optimizer) is mx.optimizer.SGD`` and every weight and gradient is a dense
    (``'default'`` storage) float32 array on a CPU context.
    """
    if type(optimizer) is not mx.optimizer.SGD:  # pylint: disable=unidiomatic-typecheck
        return False
    return all(a.context.device_type == 'cpu' and a.stype == 'default' and a.dtype == np.float32
               for a in list(weights) + list(grads))


class Updater(mx.optimizer.Updater):
    """``mx.optimizer.Updater`` whose SGD updates on a CPU run one weight per kernel call.

    Args:
        optimizer (mx.optimizer.Optimizer): any optimizer; only ``mx.optimizer.SGD`` on dense
            float32 CPU arrays takes the one-weight path (:func:`runs_single_array`).

    Called as the base class: ``updater(index, grad, weight)`` with an index and two NDArrays, or
    three lists. The weights, momenta, update counts and learning rates are bit-identical to
    MXNet's Updater (tests/test_updater.py).
    """

    def __call__(self, index, grad, weight):
        if isinstance(index, (list, tuple)):
            indices, grads, weights = list(index), list(grad), list(weight)
        else:
            indices, grads, weights = [index], [grad], [weight]
        if not indices or not runs_single_array(self.optimizer, weights, grads):
            return super().__call__(index, grad, weight)
        opt = self.optimizer
        opt._set_current_context(weights[0].context.device_id)  # pylint: disable=protected-access
        for idx, w in zip(indices, weights):
            if idx not in self.states:
                self.states[idx] = opt.create_state_multi_precision(idx, w)
                self.states_synced[idx] = True
            elif not self.states_synced[idx]:
                self.states[idx] = self.sync_state_context(self.states[idx], w.context)
                self.states_synced[idx] = True
        # MXNet's Updater hands SGD chunks of aggregate_num weights (one at a time when it is 0),
        # and SGD counts a whole chunk before reading its learning rates.
        size = opt.aggregate_num if self.aggregate_updates else 1
        for start in range(0, len(indices), size):
            chunk = slice(start, start + size)
            _sgd_update(opt, indices[chunk], weights[chunk], grads[chunk],
                        [self.states[i] for i in indices[chunk]])
        return None


def _sgd_update(opt, indices, weights, grads, states):
    """One chunk of ``mx.optimizer.SGD``'s dense update, one weight per kernel call."""
    opt._update_count(indices)  # pylint: disable=protected-access
    lrs, wds = opt._get_lrs(indices), opt._get_wds(indices)  # pylint: disable=protected-access
    kwargs = {'rescale_grad': opt.rescale_grad}
    if opt.momentum > 0:
        kwargs['momentum'] = opt.momentum
    if opt.clip_gradient:
        kwargs['clip_gradient'] = opt.clip_gradient
    for weight, grad, state, lr, wd in zip(weights, grads, states, lrs, wds):
        if opt.momentum > 0:
            nd.multi_sgd_mom_update(weight, grad, state, out=[weight], num_weights=1, lrs=(lr,),
                                    wds=(wd,), **kwargs)
        else:
            nd.multi_sgd_update(weight, grad, out=[weight], num_weights=1, lrs=(lr,), wds=(wd,),
                                **kwargs)
