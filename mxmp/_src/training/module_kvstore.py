"""The kvstore of :class:`mxmp.Module`: it only reduces gradients, in float32.

MXNet's Module can run the optimizer on the kvstore (``update_on_kvstore``); mxmp's never does,
because every gradient must be checked for overflow after the reduction and before any update
(:mod:`mxmp._src.training.step`). So the kvstore reduces the gradients (``pushpull``; ``push`` and
``pull`` for sparse ones), float32 for the low-precision weights of ``cast_params``, and every
worker checks the same reduced gradients (all skip the same steps) and updates its own weights.
On a dist kvstore every worker starts from worker 0's weights.
"""
from mxnet import nd

from ..distributed.broadcast import broadcast_from_root
from ..dtypes import is_low_precision
from .master_weights import device_update

__all__ = ['start_kvstore', 'reduced_updates']


def start_kvstore(module, kv):
    """Give the kvstore ``kv`` the parameters of ``module`` (it only reduces gradients); on a
    dist kvstore every worker then starts from worker 0's parameters (``set_params``, so the
    master weights follow)."""
    module.logger.info('mxmp.Module: update_on_kvstore=False on the %r kvstore: it only '
                       'reduces the gradients; every worker checks them for overflow and '
                       'updates its own weights', kv.type)
    if module._compression_params:
        kv.set_gradient_compression(module._compression_params)
    names = module._exec_group.param_names
    for name in names:
        kv.init(name, module._arg_params[name])
    if 'dist' in kv.type:
        # kv.init stored worker 0's float32 values; MXNet's Module without update_on_kvstore
        # would keep each worker's own. Every worker starts from worker 0's (the one root-rank
        # broadcast, which waits for each pull before any gradient is pushed on its key).
        broadcast_from_root([(name, [module._arg_params[name]]) for name in names],
                            lambda name, wire: kv.pull(name, out=wire))
        module.set_params(module._arg_params, module._aux_params, force_init=True)


def reduced_updates(module):
    """The optimizer calls of one step of ``module``, after the gradient reduction.

    Returns:
        list of ``(updater, DeviceUpdate)``, one per context, for
        :meth:`mxmp._src.training.step.Step.apply`: the gradients reduced across contexts and
        workers by the kvstore (if any; low-precision gradients are cast to float32 first),
        low-precision weights routed to their float32 master weights.
    """
    group, ndev, kv = module._exec_group, len(module._context), module._kvstore
    per_ctx = [[] for _ in range(ndev)]
    for i, (name, weights, grads) in enumerate(zip(group.param_names, group.param_arrays,
                                                   group.grad_arrays)):
        if grads[0] is None:
            continue
        low = name in module._lp_names and is_low_precision(weights[0].dtype)
        if low:
            grads = [nd.amp_cast(g, dtype='float32') for g in grads]
        if kv:
            if grads[0].stype == 'default' and weights[0].stype == 'default':
                kv.pushpull(name, grads, priority=-i)
            else:
                kv.push(name, grads, priority=-i)
                kv.pull(name, out=grads, priority=-i)
        masters = (module._step.masters.get(name, weights, track=False) if low
                   else [None] * ndev)
        for k in range(ndev):
            per_ctx[k].append((i * ndev + k, weights[k], grads[k], masters[k]))
    return [(module._updater, device_update(entries)) for entries in per_ctx]
