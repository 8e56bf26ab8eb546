"""What a training graph keeps from its forward pass for the backward pass, by dtype and op.

``python -m benchmarks.backward_kept --model bert_base --batch-size 8 --seq-len 128 --mode M``
builds the workload of :mod:`benchmarks.workloads` in one mode of :mod:`benchmarks.rss_stages`
(float32, mxmp, mxmp_cast_params), runs one recorded forward and backward pass of the
hybridized network (so the graph is the one its CachedOp runs: mxmp's converted graph), binds
that graph in MXNet's symbolic executor with the Parameters' ``grad_req`` and reads the
executor's full graph (``Executor.debug_str()``: forward and backward nodes, built by the same
gradient pass and the same ``FGradient`` functions as the CachedOp's). A forward entry is
*kept* when a backward node reads it: it stays allocated from its forward node to that
backward node, so the kept entries are what the forward pass leaves at the start of the
backward pass. Their bytes (shapes and dtypes from MXNet's own inference on the graph) are
summed by dtype and by the producing op (identity ops whose output shares its input's memory,
such as Reshape, are counted once, under the op that made the data; a hidden output, such as
MXNet's Dropout mask or LayerNorm's mean, is sized by :func:`hidden_output`). Also printed: the
executor's memory plan total (``Total N MB allocated``: every internal entry of the forward and
backward graph, after MXNet's sharing). ``--top N`` lists the N largest kept entries by
producing op and consumer.
"""
import argparse
import re
from collections import defaultdict

import numpy as np

from benchmarks.modes import SEED
from benchmarks.workloads import workload_for

MODES = ('float32', 'mxmp', 'mxmp_cast_params')
#: ops whose output the memory planner may give its input's memory whatever else reads the
#: input (``FInplaceIdentity``): the data is counted once, at the op that made it.
IDENTITY_OPS = {'Reshape', 'reshape', 'Flatten', 'flatten', 'expand_dims', '_copy',
                '_identity_with_attr_like_rhs', 'identity', '_npx_reshape'}

_NODE = re.compile(r'^Op:([^,]+), Name=(.*)$')
_ARG = re.compile(r'^\targ\[\d+\]=(.*)\((\d+)\)( version=\d+)?$')


def parse_debug_str(text):
    """[(op, name, [(input node name, output index)])] of an executor's ``debug_str()``."""
    nodes, current, in_inputs = [], None, False
    for line in text.splitlines():
        m = _NODE.match(line)
        if m:
            current = (m.group(1), m.group(2), [])
            nodes.append(current)
            in_inputs = False
            continue
        if line == 'Inputs:':
            in_inputs = current is not None
            continue
        if not line.startswith('\t'):
            in_inputs = False
            continue
        m = _ARG.match(line)
        if in_inputs and m:
            current[2].append((m.group(1), int(m.group(2))))
    return nodes


def entry_table(sym, shapes, types):
    """{(node name, output index): (op, shape, dtype name)} of every forward entry of
    ``sym`` (MXNet's shape and type inference on its internals)."""
    import json
    import mxnet as mx
    from mxmp._src.dtypes import dtype_name
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    internals = sym.get_internals()
    arg_shapes, out_shapes, _ = internals.infer_shape(**shapes)
    _, out_types, _ = internals.infer_type(**types)
    table, seen = {}, defaultdict(int)
    ops = {node['name']: node['op'] for node in graph['nodes']}
    for k in range(len(out_shapes)):
        name = internals[k].name      # the node of the k-th output (outputs in node order)
        index = seen[name]
        seen[name] += 1
        dt = np.dtype(out_types[k])
        table[(name, index)] = (ops[name], out_shapes[k],
                                dtype_name(out_types[k]) if dt.kind == 'V' or dt.kind == 'f'
                                else dt.name, dt.itemsize)
    del arg_shapes, mx
    return table, graph


def hidden_output(entry, first, by_name):
    """(op, shape, dtype, itemsize) of a hidden output ``entry`` (MXNet's internals list the
    visible outputs only) from its node's output 0 ``first``: Dropout's mask has the data's
    shape and dtype, LayerNorm's mean and standard deviation the data's shape with the
    normalized axis 1 (float32); other ops' are counted as empty (shape ``()``, dtype '?')."""
    op, shape, dt, itemsize = first
    if op == 'Dropout':
        return first
    if op == 'LayerNorm':
        axis = int(by_name[entry[0]].get('attrs', {}).get('axis', -1)) % len(shape)
        return op, tuple(1 if k == axis else d for k, d in enumerate(shape)), 'float32', 4
    return op, (), '?', 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='bert_base')
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--seq-len', type=int, default=128)
    p.add_argument('--mode', choices=MODES, default='mxmp')
    p.add_argument('--top', type=int, default=0)
    args = p.parse_args(argv)
    import mxnet as mx
    from mxnet import autograd
    import mxmp
    mx.random.seed(SEED)
    np.random.seed(SEED)
    wl = workload_for(dict(model=args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                           input_size=224, classes=1000))
    ctx = mx.cpu()
    xs, _ = wl.batches(mx, args.batch_size, ctx)[0]
    net = wl.model()
    wl.initialize(net, mx, ctx)
    if args.mode != 'float32':
        net = mxmp.convert(net, policy=mxmp.Policy(
            'bfloat16', param_dtype='bfloat16' if args.mode == 'mxmp_cast_params'
            else 'float32'))
    net.hybridize(static_alloc=True, static_shape=True)
    with autograd.record():
        out = net(*xs)
    out.backward()
    inputs, sym = net._cached_graph
    params = net.collect_params()
    shapes = {i.name: x.shape for i, x in zip(inputs, xs)}
    types = {i.name: x.dtype for i, x in zip(inputs, xs)}
    for n, prm in params.items():
        shapes[n], types[n] = prm.shape, prm.dtype
    known = set(sym.list_arguments()) | set(sym.list_auxiliary_states())
    shapes = {k: v for k, v in shapes.items() if k in known}
    types = {k: v for k, v in types.items() if k in known}
    reqs = {n: 'write' if n in params.keys() and params[n].grad_req != 'null' else 'null'
            for n in sym.list_arguments()}
    exe = sym.simple_bind(ctx, grad_req=reqs, type_dict=types, **shapes)
    text = exe.debug_str()
    table, graph = entry_table(sym, shapes, types)
    by_name = {node['name']: node for node in graph['nodes']}

    def source(entry):  # follow identity ops back to the entry that holds the data
        while True:
            node = by_name.get(entry[0])
            if node is None or node['op'] not in IDENTITY_OPS:
                return entry
            src = node['inputs'][0]
            if by_name[graph['nodes'][src[0]]['name']]['op'] == 'null':
                return entry
            entry = (graph['nodes'][src[0]]['name'], src[1])

    kept = defaultdict(set)   # source entry -> backward ops reading it
    for op, name, ins in parse_debug_str(text):
        if name in by_name:
            continue   # a forward node
        for entry in ins:
            if entry not in table and (entry[0], 0) in table:
                table[entry] = hidden_output(entry, table[(entry[0], 0)], by_name)
            if entry in table and table[entry][0] != 'null':
                kept[source(entry)].add(op)
    by_dtype, by_op, rows = defaultdict(float), defaultdict(float), []
    for entry, readers in kept.items():
        op, shape, dt, itemsize = table[entry]
        mib = int(np.prod(shape)) * itemsize / 2.0 ** 20
        by_dtype[dt] += mib
        key = '%s -> %s' % (op if entry[1] == 0 else '%s[%d]' % (op, entry[1]),
                            dt)
        by_op[key] += mib
        rows.append((mib, entry, op, dt, sorted(readers)))
    total = sum(by_dtype.values())
    print('%s %s b%d s%d: kept for the backward pass %.1f MiB in %d entries'
          % (args.model, args.mode, args.batch_size, args.seq_len, total, len(kept)))
    print('by dtype: ' + ', '.join('%s %.1f' % kv for kv in sorted(by_dtype.items())))
    print('by producing op (op[output] -> dtype: MiB):')
    for key, mib in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print('  %-55s %8.1f' % (key, mib))
    plan = re.search(r'Total (\d+) MB allocated', text)
    print("executor's memory plan: %s MB (forward and backward internal entries)"
          % (plan.group(1) if plan else '?'))
    for mib, entry, op, dt, readers in sorted(rows, reverse=True)[:args.top]:
        print('  %7.2f MiB %s %s(%d) read by %s' % (mib, dt, entry[0], entry[1],
                                                     ', '.join(readers)))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
