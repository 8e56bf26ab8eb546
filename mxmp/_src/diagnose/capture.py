""":func:`diagnose`: float32 iterations of a network with every layer's output rewired through
``y + probe`` (a zero input whose gradient is d loss / d y); the method is in docs/diagnose.md.
"""
import collections
import json

import numpy as np

from ..errors import mxnet_error_line
from ..graph.strip import float32_arrays
from ..graph.symbol_json import dump
from .report import NumericsReport
from .stats import FORMATS, LayerStats, TensorStats, advise_loss_scale, judge_layer, merged

#: Suffix of the probe variables and ``+ probe`` nodes added to the traced graph (node names).
_PROBE = '__probe__'


def _as_nd(x, ctx):
    import mxnet as mx
    if isinstance(x, mx.nd.NDArray):
        return x.as_in_context(ctx).astype('float32', copy=False)
    return mx.nd.array(np.asarray(x), ctx=ctx, dtype='float32')


def _instrument(sym, layer_names):
    """Rewire every visible output ``y`` of the named nodes through ``y + probe``, ``probe``
    a new zero input whose gradient is d loss / d y.

    Returns (new symbol, list of (layer name, name of the node's output in the internals,
    probe variable name)). The activation is read from the node's own output, not from the
    ``+ probe`` node: that one may be a head of the graph too, and an executor given the same
    entry twice as an output does not sum the two head gradients.
    """
    js = json.loads(sym.tojson())
    n_out = collections.Counter(out.rsplit('_output', 1)[0]
                                for out in sym.get_internals().list_outputs())
    wanted = set(layer_names)
    nodes, remap, probes, new_id = [], {}, [], {}

    def entry(s, i, v):
        return list(remap.get((s, i), (new_id[s], i))) + [v]

    for old, node in enumerate(js['nodes']):
        new = dict(node)
        new['inputs'] = [entry(*e) for e in node['inputs']]
        nodes.append(new)
        me = new_id[old] = len(nodes) - 1
        if node['op'] == 'null' or node['name'] not in wanted:
            continue
        for k in range(n_out.get(node['name'], 1)):
            var = '%s%s%d' % (node['name'], _PROBE, k)
            add = '%s%s_add%d' % (node['name'], _PROBE, k)
            nodes.append({'op': 'null', 'name': var, 'inputs': []})
            nodes.append({'op': 'elemwise_add', 'name': add,
                          'inputs': [[me, k, 0], [len(nodes) - 1, 0, 0]]})
            remap[(old, k)] = (len(nodes) - 1, 0)
            probes.append((node['name'], '%s_output%s' % (
                node['name'], k if n_out.get(node['name'], 1) > 1 else ''), var))
    return dump(dict(js, nodes=nodes, heads=[entry(*h) for h in js['heads']])), probes


def _layer_nodes(sym, policy, data_names):
    """(name, op, weight parameter names) of the network's nodes that compute in the target
    dtype. Nodes the pass adds to explain's graph (the residual rule's identity, the
    reduction rule's nodes) are not layers of the network and have no output to probe in it:
    they are left out, as mxmp's casts are."""
    from ..graph.plan import explain
    rows = explain(sym, policy=policy, data_names=data_names)
    nodes = json.loads(sym.tojson())['nodes']
    by_name = {n['name']: n for n in nodes}
    out = []
    for row in rows:
        if row.op == 'null' or row.dtype != policy.target_dtype or row.name not in by_name:
            continue
        node = by_name[row.name]
        keep32 = set(policy.float32_inputs(node['op'])) | set(policy.index_inputs(node['op']))
        params = tuple(nodes[src]['name'] for pos, (src, _, _) in enumerate(node['inputs'])
                       if nodes[src]['op'] == 'null' and pos not in keep32
                       and nodes[src]['name'] not in data_names)
        out.append((row.name, row.op, params))
    return out


def diagnose(net, data, label, loss_fn, target_dtype=None, steps=3, learning_rate=0.01,
             ctx=None, data_names=('data',), policy=None, underflow_tol=0.01,
             max_loss_scale=2.0 ** 24, verbose=True):
    """Run float32 iterations of ``net`` and report which layers float16/bfloat16 would break.

    Args:
        net (gluon.HybridBlock): the float32 network, initialized (deferred initialization is
            completed by one forward pass on ``data``); a ``SymbolBlock`` works. Not modified:
            the iterations run on copies of its parameters.
        data (NDArray or numpy array, or a tuple of them for several inputs): one float32
            batch, batch first; used for every iteration.
        label (NDArray or numpy array): the batch's labels, passed to ``loss_fn``.
        loss_fn (callable): ``loss_fn(output, label) -> NDArray`` of per-sample (or scalar)
            losses; ``output`` is the float32 output (a list for several outputs).
        target_dtype (str or None): ``'bfloat16'`` or ``'float16'``: the layers reported
            (those the pass runs in it) and the format of the recommendation and the table.
            Default: ``policy.target_dtype`` if a policy is given, else ``'bfloat16'``.
        steps (int): iterations, >= 1. Default 3.
        learning_rate (float): SGD step between iterations on the parameter copies
            (``w -= learning_rate * grad / batch``); 0 keeps the weights. Default 0.01.
        ctx (mx.Context): default ``mx.cpu()``.
        data_names (tuple of str): the network's input names. Default ``('data',)``.
        policy (mxmp.Policy): decides the reported layers; default ``Policy(target_dtype)``.
        underflow_tol (float): flush-to-zero fraction above which a layer is flagged
            (:func:`~mxmp._src.diagnose.stats.judge_layer`). Default 0.01.
        max_loss_scale (float): cap of the recommended loss scale; default 2**24 (the cap of
            mxmp's and contrib.amp's dynamic scalers).
        verbose (bool): print :meth:`NumericsReport.table`. Default True.

    Returns:
        NumericsReport

    Raises:
        TypeError: ``net`` is not a HybridBlock, ``policy`` not a Policy, ``loss_fn`` not
            callable.
        ValueError: unknown dtype; ``target_dtype`` contradicts ``policy``; ``steps`` < 1;
            the network is not initialized; its graph needs inputs other than ``data_names``
            and its parameters; shapes that do not fit.
    """
    import mxnet as mx
    from mxnet import autograd, gluon
    from ..policy.policy import resolve_policy
    if not isinstance(net, gluon.HybridBlock):
        raise TypeError('diagnose needs a gluon.HybridBlock (or a SymbolBlock loaded with '
                        'gluon.SymbolBlock.imports), got %s' % type(net).__name__)
    policy = resolve_policy(policy, target_dtype)
    target = policy.target_dtype
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError('steps must be an integer >= 1, got %r' % (steps,))
    if not callable(loss_fn):
        raise TypeError('loss_fn must be callable as loss_fn(output, label), got %r' % (loss_fn,))
    data_names = (data_names,) if isinstance(data_names, str) else tuple(data_names)
    ctx = ctx or mx.cpu()
    inputs = list(data) if isinstance(data, (list, tuple)) else [data]
    if len(inputs) != len(data_names):
        raise ValueError('%d data arrays for %d data_names %s' % (len(inputs), len(data_names),
                                                                  data_names))
    inputs = [_as_nd(x, ctx) for x in inputs]
    label = _as_nd(label, ctx) if not isinstance(label, mx.nd.NDArray) else \
        label.as_in_context(ctx)
    batch = int(inputs[0].shape[0])

    params = {p.name: p for p in net.collect_params().values()}
    if any(p._deferred_init for p in params.values()):
        with autograd.pause():
            net(*inputs)
    for p in params.values():
        if p._data is None:
            raise ValueError('parameter %s is not initialized: call net.initialize() (or load '
                             'its parameters) before diagnose' % p.name)

    out = net(*[mx.sym.var(n) for n in data_names])
    sym = mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
    layers = _layer_nodes(sym, policy, data_names)
    probed, probes = _instrument(sym, [name for name, _, _ in layers])
    n_heads = len(sym.list_outputs())
    internals = probed.get_internals()
    group = mx.sym.Group([probed[i] for i in range(n_heads)]
                         + [internals[out] for _, out, _ in probes])

    args, aux = group.list_arguments(), group.list_auxiliary_states()
    probe_vars = {var for _, _, var in probes}
    missing = [a for a in args + aux if a not in params and a not in probe_vars
               and a not in data_names]
    if missing:
        raise ValueError('the network graph needs inputs that are neither data_names %s nor '
                         'parameters: %s; pass them in data_names (and data)'
                         % (data_names, ', '.join(missing)))
    data_shapes = {n: x.shape for n, x in zip(data_names, inputs)}
    shapes = dict(data_shapes, **{n: params[n].shape for n in args + aux if n in params})
    grad_req = {n: 'write' if n in probe_vars or (n in params and params[n].grad_req != 'null')
                else 'null' for n in args}
    try:
        exe = group.simple_bind(ctx, grad_req=grad_req, **shapes)
    except mx.base.MXNetError as err:
        raise ValueError('cannot bind the network for data shapes %s: %s'
                         % (data_shapes, mxnet_error_line(err))) from None
    with autograd.pause():
        values = float32_arrays({n: params[n].list_data()[0] for n in args + aux if n in params})
        for name, arr in list(exe.arg_dict.items()) + list(exe.aux_dict.items()):
            if name in values:
                values[name].copyto(arr)
            elif name in probe_vars:
                arr[:] = 0

    acts, agrads, weights, wgrads, losses = {}, {}, {}, {}, []
    for step in range(steps):
        feed = dict(zip(data_names, inputs))
        exe.forward(is_train=True, **feed)
        outs = [o.copy() for o in exe.outputs[:n_heads]]
        for o in outs:
            o.attach_grad()
        with autograd.record():
            loss = loss_fn(outs[0] if n_heads == 1 else outs, label)
        loss.backward()
        losses.append(float(loss.mean().asscalar()))
        exe.backward(out_grads=[o.grad for o in outs]
                     + [mx.nd.zeros_like(o) for o in exe.outputs[n_heads:]])
        for (layer, _, var), act in zip(probes, exe.outputs[n_heads:]):
            acts[layer] = merged((acts.get(layer), TensorStats.of(act.asnumpy())))
            agrads[layer] = merged((agrads.get(layer),
                                    TensorStats.of(exe.grad_dict[var].asnumpy())))
        seen = {}
        for layer, _, names in layers:
            for n in names:
                if n not in seen:
                    grad = exe.grad_dict.get(n)
                    seen[n] = (TensorStats.of(exe.arg_dict[n].asnumpy()),
                               None if grad is None else TensorStats.of(grad.asnumpy()))
                weights[layer] = merged((weights.get(layer), seen[n][0]))
                wgrads[layer] = merged((wgrads.get(layer), seen[n][1]))
        if learning_rate and step + 1 < steps:
            for n, g in exe.grad_dict.items():
                if g is not None and n in params:
                    exe.arg_dict[n][:] -= (learning_rate / batch) * g

    result = tuple(LayerStats(name, op, names, acts[name], agrads[name], weights.get(name),
                              wgrads.get(name)) for name, op, names in layers)
    advice = {name: advise_loss_scale(result, fmt, max_loss_scale) for name, fmt in FORMATS.items()}
    reasons = {}
    for name, fmt in FORMATS.items():
        whys = ((layer.name, judge_layer(layer, fmt, advice[name].log2_scale, underflow_tol))
                for layer in result)
        reasons[name] = {layer: why for layer, why in whys if why}
    report = NumericsReport(target, steps, batch, tuple(losses), result, advice, reasons,
                            float(underflow_tol))
    if verbose:
        print(report.table())
    return report
