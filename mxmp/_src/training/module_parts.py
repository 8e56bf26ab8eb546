"""The parts of :class:`mxmp.Module`: the float32 master weights of its low-precision
parameters, its optimizer calls, and the resolution of its precision arguments."""

from mxnet import nd

from ..distributed import broadcast_from_root
from ..dtypes import is_low_precision, normalize_dtype
from ..policy.policy import resolve_policy
from .master_weights import MasterWeights
from .step import device_update

__all__ = ['ModuleMasters', 'start_kvstore', 'reduced_updates', 'module_policy']


class ModuleMasters(MasterWeights):
    """float32 master weights of the parameters ``lp_names`` (frozenset of str) a Module
    stores in the target dtype (``cast_params``), by name."""

    def __init__(self, lp_names):
        super().__init__()
        self.lp_names = lp_names

    def of(self, name, exec_group):
        """The masters (one float32 NDArray per context) of parameter ``name``."""
        arrays = exec_group.param_arrays[exec_group.param_names.index(name)]
        return self.get(name, arrays, track=False)

    def written(self, values, exec_group, for_training=True):
        """The device parameters were just written from ``values`` (dict name -> float32
        array): masters made again from them, so no precision is lost. An inference-only bind
        (``for_training`` False) keeps none: the device holds one low-precision copy of each
        weight, and ``values`` (the host parameters) the float32 ones."""
        if not for_training:
            self.clear()
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
    """Give the kvstore ``kv`` (which only reduces gradients) the parameters ``names``; on a dist
    kvstore, ``arg_params`` become worker 0's and True is returned."""
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
    """The ``(updater, DeviceUpdate)`` per context of one step (for
    :meth:`mxmp._src.training.step.Step.apply`), after ``kv`` (or None) reduced the gradients,
    the low-precision ones cast to float32 first; optimizer index ``i * num_contexts + k``."""
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
    """``(target dtype, policy or None, cast_params bool, chosen policy or None)`` of a
    Module's arguments: the shorthands of :func:`mxmp._src.policy.policy.resolve_policy`
    (``emulate='auto'``: None); the policy emulated on every context if one lacks the kernels,
    with MXNet's kernels (``kernels='mxnet'``) on every context if one is not a CPU, and the
    policy as the user chose it (``emulate`` unresolved: what a checkpoint stores);
    ``target_dtype='float32'`` without a policy: plain MXNet. TypeError and ValueError as
    ``resolve_policy``; RuntimeError as :meth:`mxmp.Policy.on` (``emulate=False``, a context
    without the kernels)."""
    if policy is None and target_dtype is not None and \
            normalize_dtype(target_dtype, allow_float32=True) == 'float32':
        return 'float32', None, False, None
    chosen = resolve_policy(policy, target_dtype, cast_params,
                            None if emulate == 'auto' else emulate)
    on = [chosen.on(ctx) for ctx in contexts]
    kernels = 'mxnet' if any(p.kernels == 'mxnet' for p in on) else chosen.kernels
    return (chosen.target_dtype, chosen.replace(emulate=any(p.emulate for p in on),
                                                kernels=kernels),
            chosen.param_dtype == chosen.target_dtype, chosen)
