"""The parts :class:`mxmp.Module` owns: the loss-scale input of its executors, the float32
master weights of its low-precision parameters, its kvstore (which only reduces gradients), and
the resolution of its precision arguments.
"""

from mxnet import nd

from ..distributed import broadcast_from_root
from ..dtypes import is_low_precision, normalize_dtype
from ..graph.loss_heads import LOSS_SCALE_NAME
from ..policy.policy import resolve_policy
from .master_weights import MasterWeights
from .step import device_update

__all__ = ['write_loss_scale', 'ModuleMasters', 'start_kvstore', 'reduced_updates',
           'module_policy']


def write_loss_scale(exec_group, scale, written, force=False):
    """Write ``scale`` (float) into the loss-scale input (:data:`LOSS_SCALE_NAME`, shape
    ``(1,)``, float32, multiplied into the gradient of every loss op) of every executor of
    ``exec_group``, unless ``written`` (the ``(arrays, value)`` this returned last time, or
    None) shows they hold it already and not ``force``. Returns the new ``written``."""
    arrays = [e.arg_dict[LOSS_SCALE_NAME] for e in exec_group.execs]
    if not force and written is not None and written[1] == scale and \
            len(written[0]) == len(arrays) and all(a is b for a, b in zip(written[0], arrays)):
        return written
    for arr in arrays:
        arr[:] = scale
    return arrays, scale


class ModuleMasters(MasterWeights):
    """float32 master weights of a Module's parameters stored in low precision, by name.

    Args:
        lp_names (frozenset of str): the parameters stored in the target dtype
            (``cast_params``); empty: no masters.
    """

    def __init__(self, lp_names):
        super().__init__()
        self.lp_names = lp_names

    def of(self, name, exec_group):
        """The masters (one float32 NDArray per context) of parameter ``name``."""
        arrays = exec_group.param_arrays[exec_group.param_names.index(name)]
        return self.get(name, arrays, track=False)

    def written(self, values, exec_group):
        """The device parameters were just written from ``values`` (dict name -> float32
        array, or None): masters made again from them, so no precision is lost."""
        if values is None:
            return
        for name in self.lp_names:
            if name in values and name in exec_group.param_names:
                self.set_pending(name, values[name])
                self.of(name, exec_group)

    def to_host(self, arg_params):
        """Copy every master (first context) into ``arg_params`` (the host parameters)."""
        for name in self.lp_names:
            master = self.first_device(name)
            if isinstance(master, nd.NDArray):
                master.copyto(arg_params[name])


def start_kvstore(kv, names, arg_params, compression_params):
    """Give the kvstore ``kv`` the parameters ``names`` of ``arg_params`` (it only reduces
    gradients); on a dist kvstore every worker's ``arg_params`` become worker 0's (the
    root-rank broadcast, waited for before any gradient is pushed). Returns whether it did."""
    if compression_params:
        kv.set_gradient_compression(compression_params)
    for name in names:
        kv.init(name, arg_params[name])
    if 'dist' not in kv.type:
        return False
    broadcast_from_root([(name, [arg_params[name]]) for name in names],
                        lambda name, wire: kv.pull(name, out=wire))
    return True


def reduced_updates(exec_group, kv, masters, updater):
    """The optimizer calls of one step, after the reduction of the gradients.

    Args:
        exec_group: the Module's executor group.
        kv (KVStore or None): reduces the gradients across contexts and workers
            (``pushpull``; ``push`` and ``pull`` for sparse ones); low-precision gradients are
            cast to float32 first.
        masters (ModuleMasters): low-precision weights are updated through them.
        updater: the Module's updater; optimizer index ``i * num_contexts + k``.

    Returns:
        list of ``(updater, DeviceUpdate)``, one per context, for
        :meth:`mxmp._src.training.step.Step.apply`.
    """
    ndev = len(exec_group.contexts)
    per_ctx = [[] for _ in range(ndev)]
    for i, (name, weights, grads) in enumerate(zip(exec_group.param_names,
                                                   exec_group.param_arrays,
                                                   exec_group.grad_arrays)):
        if grads[0] is None:
            continue
        low = name in masters.lp_names and is_low_precision(weights[0].dtype)
        if low:
            grads = [nd.amp_cast(g, dtype='float32') for g in grads]
        if kv:
            if grads[0].stype == 'default' and weights[0].stype == 'default':
                kv.pushpull(name, grads, priority=-i)
            else:
                kv.push(name, grads, priority=-i)
                kv.pull(name, out=grads, priority=-i)
        mine = masters.get(name, weights, track=False) if low else [None] * ndev
        for k in range(ndev):
            per_ctx[k].append((i * ndev + k, weights[k], grads[k], mine[k]))
    return [(updater, device_update(entries)) for entries in per_ctx]


def module_policy(target_dtype, policy, cast_params, emulate, contexts):
    """``(target dtype, policy or None, cast_params bool)`` of a Module's arguments.

    ``target_dtype``, ``cast_params`` (None, True, False) and ``emulate`` ('auto', True, False)
    are shorthands for the policy's fields (:func:`mxmp._src.policy.policy.resolve_policy`);
    the policy's ``emulate`` is then resolved on every context (:meth:`mxmp.Policy.on`):
    emulated everywhere if one context lacks the kernels. ``target_dtype='float32'`` without a
    policy: (``'float32'``, None, False), plain MXNet.

    Raises:
        TypeError: ``policy`` is not an mxmp.Policy.
        ValueError: a shorthand contradicts ``policy``.
        RuntimeError: ``emulate`` is False and a context has no kernels for the target dtype.
    """
    if policy is None and target_dtype is not None and \
            normalize_dtype(target_dtype, allow_float32=True) == 'float32':
        return 'float32', None, False
    policy = resolve_policy(policy, target_dtype, cast_params,
                            None if emulate == 'auto' else emulate)
    emulated = any([policy.on(ctx).emulate for ctx in contexts])
    return (policy.target_dtype, policy.replace(emulate=emulated),
            policy.param_dtype == policy.target_dtype)
