"""The optimizer's updater of mxmp's Trainer and Module: ``mx.optimizer.SGD`` on dense float32
CPU arrays calls MXNet's aggregated kernel once per weight (the same numbers, faster on a CPU;
measurements in docs/training.md); every other case is ``mx.optimizer.Updater`` unchanged."""
import logging

import numpy as np
import mxnet as mx
from mxnet import nd

from ..dtypes import dtype_name

__all__ = ['Updater', 'runs_single_array', 'single_array_refusal']

logger = logging.getLogger('mxmp.updater')


def single_array_refusal(optimizer, weights, grads):
    """Why :class:`Updater` leaves ``optimizer`` and these arrays to ``mx.optimizer.Updater``
    (str), or None when it updates them one weight per kernel call: ``optimizer`` is exactly
    ``mx.optimizer.SGD`` (a subclass may change the update) and every weight and gradient
    (lists of NDArray) is dense float32 on a CPU."""
    if type(optimizer) is not mx.optimizer.SGD:  # pylint: disable=unidiomatic-typecheck
        return 'the optimizer is %s.%s, not mx.optimizer.SGD' % (
            type(optimizer).__module__, type(optimizer).__name__)
    for a in list(weights) + list(grads):
        if a.context.device_type != 'cpu' or a.stype != 'default' or a.dtype != np.float32:
            return 'an array is %s %s on %s, not dense float32 on a CPU' % (
                dtype_name(a.dtype), a.stype, a.context)
    return None


def runs_single_array(optimizer, weights, grads):
    """bool: whether :class:`Updater` updates ``weights`` one per kernel call
    (:func:`single_array_refusal` finds no reason against it)."""
    return single_array_refusal(optimizer, weights, grads) is None


class Updater(mx.optimizer.Updater):
    """``mx.optimizer.Updater`` whose SGD updates on a CPU run one weight per kernel call
    (:func:`runs_single_array`), bit-identical to MXNet's: weights, states, update counts and
    learning rates. Called as the base class, with an index or lists; same states format.

    The dtype, storage and device checks of :func:`runs_single_array` are made again only when
    a call's optimizer object or arrays are not the very objects of the last call with the
    same indices (an NDArray's dtype, storage and device never change; ``param.cast``,
    ``reset_ctx`` and ``set_data`` with another dtype give a Parameter new arrays; a new
    optimizer is a new object): BERT-base checked its 402 arrays in 2.8 ms at every step
    (docs/benchmark.md). The arrays of those calls are referenced until :meth:`forget_arrays`
    or the next call with the same indices (:meth:`mxmp._src.training.step.Step.apply` forgets
    its float32 gradient copies after each step, so their buffer is freed). Every other
    per-step value (learning rates, weight decays, momentum, ``rescale_grad``,
    ``clip_gradient``) is read from the optimizer at each call, as MXNet does. A fallback to
    MXNet's updater is logged at DEBUG level (logger ``mxmp.updater``) with its reason, once
    per change of the arrays.
    """

    #: Calls (distinct index lists) whose checks are kept; more, and all are forgotten.
    MAX_CHECKED_CALLS = 256

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._checked = {}   # tuple of indices -> (optimizer, weights, grads, verdict)

    def forget_arrays(self):
        """Drop the references to the arrays of the calls checked so far (they are checked
        again at their next call)."""
        self._checked.clear()

    def _single_array(self, indices, weights, grads):
        key = tuple(indices)
        last = self._checked.get(key)
        if last is not None and last[0] is self.optimizer \
                and all(a is b for a, b in zip(last[1], weights)) \
                and all(a is b for a, b in zip(last[2], grads)):
            return last[3]
        single = runs_single_array(self.optimizer, weights, grads)
        if not single and logger.isEnabledFor(logging.DEBUG):
            logger.debug('mxmp Updater: MXNet\'s updater updates these %d weights: %s',
                         len(weights), single_array_refusal(self.optimizer, weights, grads))
        if len(self._checked) >= self.MAX_CHECKED_CALLS:
            self._checked.clear()
        self._checked[key] = (self.optimizer, list(weights), list(grads), single)
        return single

    def __call__(self, index, grad, weight):
        if isinstance(index, (list, tuple)):
            indices, grads, weights = list(index), list(grad), list(weight)
        else:
            indices, grads, weights = [index], [grad], [weight]
        if not indices or not self._single_array(indices, weights, grads):
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
