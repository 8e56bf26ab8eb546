"""The optimizer's updater of mxmp's Trainer and Module: ``mx.optimizer.SGD`` on dense float32
CPU arrays runs as one pass of mxmp's library op ``mxmp_multi_sgd_update`` over all the weights
of a call (the float32 master weights, their momentum and, where the Trainer keeps bfloat16
weights, the bfloat16 copy together), else, without the library, MXNet's aggregated kernel once
per weight: the same numbers as MXNet's Updater, faster on a CPU (measurements in
docs/training.md); every other case is ``mx.optimizer.Updater`` unchanged."""
import logging

import numpy as np
import mxnet as mx
from mxnet import nd

from ..dtypes import dtype_name
from ..device import to_default_layout

__all__ = ['Updater', 'runs_single_array', 'single_array_refusal', 'library_update']

logger = logging.getLogger('mxmp.updater')


def library_update():
    """bool: whether SGD updates run through mxmp's library op ``mxmp_multi_sgd_update``: the
    library builds and loads here (:func:`mxmp._src.kernels.build.load_library`, once per
    process; ``MXMP_KERNELS=mxnet`` turns it off)."""
    from ..kernels.build import load_library
    return load_library() is not None


def single_array_refusal(optimizer, weights, grads, targets=None):
    """Why :class:`Updater` leaves ``optimizer`` and these arrays to ``mx.optimizer.Updater``
    (str), or None when it updates them itself (one library pass, or one MXNet kernel call per
    weight): ``optimizer`` is exactly ``mx.optimizer.SGD`` (a subclass may change the update),
    every weight (lists of NDArray) is dense float32 on a CPU, and every gradient dense float32
    on a CPU, or bfloat16 where ``targets`` (None, or a list aligned with ``weights`` of None or
    the dense bfloat16 CPU array rewritten from that weight, its float32 master) has one."""
    if type(optimizer) is not mx.optimizer.SGD:  # pylint: disable=unidiomatic-typecheck
        return 'the optimizer is %s.%s, not mx.optimizer.SGD' % (
            type(optimizer).__module__, type(optimizer).__name__)
    targets = [None] * len(weights) if targets is None else targets
    for w, g, t in zip(weights, grads, targets):
        for a, dtypes in ((w, ('float32',)), (g, ('float32',) if t is None else
                                              ('float32', 'bfloat16')),
                          (t, ('bfloat16',))):
            if a is None:
                continue
            if a.context.device_type != 'cpu' or a.stype != 'default' or \
                    dtype_name(a.dtype) not in dtypes:
                return 'an array is %s %s on %s, not dense %s on a CPU' % (
                    dtype_name(a.dtype), a.stype, a.context, ' or '.join(dtypes))
    return None


def runs_single_array(optimizer, weights, grads, targets=None):
    """bool: whether :class:`Updater` updates ``weights`` itself (:func:`single_array_refusal`
    finds no reason against it)."""
    return single_array_refusal(optimizer, weights, grads, targets) is None


class Updater(mx.optimizer.Updater):
    """``mx.optimizer.Updater`` whose SGD updates on a CPU (:func:`runs_single_array`) run as
    one pass of mxmp's library op ``mxmp_multi_sgd_update`` over all weights of a call
    (:func:`library_update`; else MXNet's aggregated kernel once per weight), bit-identical to
    MXNet's: weights, states, update counts and learning rates. Called as the base class, with
    an index or lists; same states format. :meth:`update_with_targets` also rewrites the
    bfloat16 weights of float32 master weights in the same pass.

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
        # (tuple of indices, whether with targets) -> (optimizer, arrays, verdict)
        self._checked = {}

    def forget_arrays(self):
        """Drop the references to the arrays of the calls checked so far (they are checked
        again at their next call)."""
        self._checked.clear()

    def _single_array(self, indices, weights, grads, targets=None):
        key = (tuple(indices), targets is not None)
        arrays = list(weights) + list(grads) + list(targets or ())
        last = self._checked.get(key)
        if last is not None and last[0] is self.optimizer and len(last[1]) == len(arrays) \
                and all(a is b for a, b in zip(last[1], arrays)):
            return last[2]
        single = runs_single_array(self.optimizer, weights, grads, targets)
        if not single and logger.isEnabledFor(logging.DEBUG):
            logger.debug('mxmp Updater: MXNet\'s updater updates these %d weights: %s',
                         len(weights),
                         single_array_refusal(self.optimizer, weights, grads, targets))
        if len(self._checked) >= self.MAX_CHECKED_CALLS:
            self._checked.clear()
        self._checked[key] = (self.optimizer, arrays, single)
        return single

    def __call__(self, index, grad, weight):
        if isinstance(index, (list, tuple)):
            indices, grads, weights = list(index), list(grad), list(weight)
        else:
            indices, grads, weights = [index], [grad], [weight]
        if not indices or not self._single_array(indices, weights, grads):
            return super().__call__(index, grad, weight)
        self._sgd(indices, grads, weights, [None] * len(indices), library_update())
        return None

    def update_with_targets(self, indices, grads, weights, targets):
        """Update ``weights`` (float32 master weights, list of NDArray) with ``grads`` (float32,
        or bfloat16 where the weight has a target) and write each ``targets`` entry that is not
        None (a bfloat16 NDArray) from its updated master (rounded to nearest even, as
        ``amp_cast``), all in one library pass; the same numbers as casting the gradients to
        float32, calling this updater and casting the masters back. Returns False, having
        changed nothing, where that pass does not apply (another optimizer or dtype, no
        library): the caller then casts and calls the updater itself."""
        indices, grads, weights, targets = (list(a) for a in (indices, grads, weights, targets))
        if not indices or not library_update() or \
                not self._single_array(indices, weights, grads, targets):
            return False
        self._sgd(indices, grads, weights, targets, True)
        return True

    def _sgd(self, indices, grads, weights, targets, library):
        opt = self.optimizer
        opt._set_current_context(weights[0].context.device_id)  # pylint: disable=protected-access
        for idx, w in zip(indices, weights):
            if idx not in self.states:
                self.states[idx] = opt.create_state_multi_precision(idx, w)
            elif not self.states_synced[idx]:
                self.states[idx] = self.sync_state_context(self.states[idx], w.context)
            self.states_synced[idx] = True
        # MXNet's Updater hands SGD chunks of aggregate_num weights (one at a time when it is 0),
        # and SGD counts a whole chunk before reading its learning rates: the counts and rates
        # of every chunk, in that order, then one pass over all of them.
        size = opt.aggregate_num if self.aggregate_updates else 1
        lrs, wds = [], []
        for start in range(0, len(indices), size):
            chunk = indices[start:start + size]
            opt._update_count(chunk)  # pylint: disable=protected-access
            lrs += opt._get_lrs(chunk)  # pylint: disable=protected-access
            wds += opt._get_wds(chunk)  # pylint: disable=protected-access
        states = [self.states[i] for i in indices]
        if library:
            _library_sgd(opt, grads, weights, states, targets, lrs, wds)
        else:
            _kernel_sgd(opt, grads, weights, states, lrs, wds)


def _sgd_kwargs(opt):
    """The scalar arguments of MXNet's SGD kernels as ``SGD._update_impl`` passes them."""
    kwargs = {'rescale_grad': opt.rescale_grad}
    if opt.clip_gradient:
        kwargs['clip_gradient'] = opt.clip_gradient
    if opt.momentum > 0:
        kwargs['momentum'] = opt.momentum
    return kwargs


def _kernel_sgd(opt, grads, weights, states, lrs, wds):
    """``mx.optimizer.SGD``'s dense update, one MXNet kernel call per weight."""
    kwargs = _sgd_kwargs(opt)
    for weight, grad, state, lr, wd in zip(weights, grads, states, lrs, wds):
        arrays = (weight, grad, state) if opt.momentum > 0 else (weight, grad)
        update = nd.multi_sgd_mom_update if opt.momentum > 0 else nd.multi_sgd_update
        update(*arrays, out=[weight], num_weights=1, lrs=(lr,), wds=(wd,), **kwargs)


def _library_sgd(opt, grads, weights, states, targets, lrs, wds):
    """``mx.optimizer.SGD``'s dense update of all ``weights`` in one call of the library's
    ``mxmp_multi_sgd_update``, writing the bfloat16 ``targets`` (None: none) from them. The
    scalars go as MXNet's kernels get them (their strings), so the library reads the same
    float32 values (mxmp_ops.cc)."""
    momentum = opt.momentum > 0
    inputs = []
    for weight, grad, state in zip(weights, grads, states):
        inputs += (weight, grad, state) if momentum else (weight, grad)
    outputs = list(weights) + (list(states) if momentum else []) + \
        [t for t in targets if t is not None]
    # An inference forward leaves a Convolution's weight (and a cast_params bfloat16 copy) in
    # oneDNN's blocked layout, which a library op cannot read (MXNet: "We can't generate TBlob
    # for MKLDNN data"); MXNet's own update kernels reorder it themselves
    to_default_layout(inputs + outputs)
    nd.mxmp_multi_sgd_update(  # pylint: disable=no-member
        *inputs, out=outputs, num_weights=len(weights), lrs=tuple(float(v) for v in lrs),
        wds=tuple(float(v) for v in wds),
        with_momentum=int(momentum),
        targets=''.join('0' if t is None else '1' for t in targets), **_sgd_kwargs(opt))
