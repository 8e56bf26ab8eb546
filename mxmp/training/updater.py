"""The optimizer's updater of mxmp's Trainer and Module: SGD on a CPU updates one array at a time.

``mx.optimizer.SGD`` updates dense weights with MXNet's aggregated kernels
(``multi_sgd_update``, ``multi_sgd_mom_update``), ``MXNET_OPTIMIZER_AGGREGATION_SIZE`` (default
4) weights per call, and even for one weight. On a CPU those kernels are several times slower
than the single-array ``sgd_mom_update``, which computes the same numbers.
Measured on MXNet 1.9.1 (AMD EPYC Zen 4) with ``OMP_NUM_THREADS=T python -m
benchmarks.optimizer_update`` (ResNet-50's 193 float32 weight arrays, 25.6 M values; median of
5 calls per variant; three runs at T=1, one at T=2):

* ``sgd_mom_update``, one weight per call: 58.0 / 62.7 / 66.6 ms at T=1, 58.1 at T=2;
* ``multi_sgd_mom_update``, 1 weight per call: 97.9 / 112.0 / 112.4 ms, 85.0;
* ``multi_sgd_mom_update``, 4 weights per call: 166.6 / 171.3 / 175.7 ms, 124.6;

and all three give bit-identical weights and momenta (the script checks it). In a ResNet-50
training step (batch 16, 1 thread) the aggregated update took 95-104 ms of about 2,300
(``scripts/benchmark.py --profile``).

:class:`Updater` is ``mx.optimizer.Updater`` that, for an ``mx.optimizer.SGD`` (exactly that
class: a subclass may change the update) whose weights and gradients are dense float32 arrays on
a CPU and momentum > 0, runs SGD's own single-array update (the branch SGD takes for sparse
gradients) for each weight; every other case (GPUs, other optimizers, SGD without momentum,
float16 weights with ``multi_precision``, sparse arrays) goes to ``mx.optimizer.Updater``
unchanged. Its states, ``get_states`` and ``set_states`` are the base class's, so state files
load either way.
"""
import numpy as np
import mxnet as mx
from mxnet import nd

__all__ = ['Updater', 'runs_single_array']


def runs_single_array(optimizer, weights, grads):
    """bool: whether :class:`Updater` updates these with the single-array SGD kernels.

    Args:
        optimizer (mx.optimizer.Optimizer): the updater's optimizer.
        weights, grads (list of NDArray): the arrays of one updater call.

    True when ``type(optimizer) is mx.optimizer.SGD`` with momentum > 0 and every weight and
    gradient is a dense (``'default'`` storage) float32 array on a CPU context. Without momentum
    ``sgd_update`` and ``multi_sgd_update`` differ in the last bit (measured: 1 ulp on half the
    values), so that case stays with MXNet's aggregated update.
    """
    # pylint: disable=unidiomatic-typecheck
    if type(optimizer) is not mx.optimizer.SGD or not optimizer.momentum > 0:
        return False
    return all(a.context.device_type == 'cpu' and a.stype == 'default' and a.dtype == np.float32
               for a in list(weights) + list(grads))


class Updater(mx.optimizer.Updater):
    """``mx.optimizer.Updater`` whose SGD updates on a CPU run one array per kernel call.

    Args:
        optimizer (mx.optimizer.Optimizer): any optimizer; only ``mx.optimizer.SGD`` on dense
            float32 CPU arrays takes the single-array path (:func:`runs_single_array`).

    Called as the base class: ``updater(index, grad, weight)`` with an index and two NDArrays, or
    three lists. The single-array path does what ``SGD._update_impl`` does for one weight:
    counts the update (``num_update``, so learning-rate schedulers see the same step), takes
    the weight's learning rate and weight decay (``lr_mult``, ``wd_mult``), and calls
    ``sgd_mom_update`` with the optimizer's ``rescale_grad``, ``momentum``, ``clip_gradient``
    and ``lazy_update``.
    """

    def __call__(self, index, grad, weight):
        if isinstance(index, (list, tuple)):
            indices, grads, weights = list(index), list(grad), list(weight)
        else:
            indices, grads, weights = [index], [grad], [weight]
        if not indices or not runs_single_array(self.optimizer, weights, grads):
            return super().__call__(index, grad, weight)
        self.optimizer._set_current_context(weights[0].context.device_id)
        for idx, g, w in zip(indices, grads, weights):
            if idx not in self.states:
                self.states[idx] = self.optimizer.create_state_multi_precision(idx, w)
                self.states_synced[idx] = True
            elif not self.states_synced[idx]:
                self.states[idx] = self.sync_state_context(self.states[idx], w.context)
                self.states_synced[idx] = True
            _sgd_update(self.optimizer, idx, w, g, self.states[idx])
        return None


def _sgd_update(opt, index, weight, grad, state):
    """One weight of ``mx.optimizer.SGD``'s momentum update, with the single-array kernel."""
    opt._update_count(index)  # pylint: disable=protected-access
    lr, wd = opt._get_lr(index), opt._get_wd(index)  # pylint: disable=protected-access
    kwargs = {'rescale_grad': opt.rescale_grad, 'momentum': opt.momentum}
    if opt.clip_gradient:
        kwargs['clip_gradient'] = opt.clip_gradient
    nd.sgd_mom_update(weight, grad, state, out=weight, lazy_update=opt.lazy_update, lr=lr, wd=wd,
                      **kwargs)
