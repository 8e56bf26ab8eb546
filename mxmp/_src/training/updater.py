"""The optimizer's updater of mxmp's Trainer and Module: ``mx.optimizer.SGD`` on dense float32
CPU arrays calls MXNet's aggregated kernel once per weight (the same numbers, faster on a CPU;
measurements in docs/training.md); every other case is ``mx.optimizer.Updater`` unchanged."""
import numpy as np
import mxnet as mx
from mxnet import nd

__all__ = ['Updater', 'runs_single_array']


def runs_single_array(optimizer, weights, grads):
    """bool: whether :class:`Updater` updates ``weights`` one per kernel call: ``optimizer`` is
    exactly ``mx.optimizer.SGD`` and every weight and gradient is dense float32 on a CPU."""
    if type(optimizer) is not mx.optimizer.SGD:  # pylint: disable=unidiomatic-typecheck
        return False
    return all(a.context.device_type == 'cpu' and a.stype == 'default' and a.dtype == np.float32
               for a in list(weights) + list(grads))


class Updater(mx.optimizer.Updater):
    """``mx.optimizer.Updater`` whose SGD updates on a CPU run one weight per kernel call
    (:func:`runs_single_array`), bit-identical to MXNet's: weights, states, update counts and
    learning rates. Called as the base class, with an index or lists; same states format."""

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
    if opt.clip_gradient:
        kwargs['clip_gradient'] = opt.clip_gradient
    if opt.momentum > 0:
        kwargs['momentum'] = opt.momentum
    for weight, grad, state, lr, wd in zip(weights, grads, states, lrs, wds):
        arrays = (weight, grad, state) if opt.momentum > 0 else (weight, grad)
        update = nd.multi_sgd_mom_update if opt.momentum > 0 else nd.multi_sgd_update
        update(*arrays, out=[weight], num_weights=1, lrs=(lr,), wds=(wd,), **kwargs)
