"""Each op of mxmp's operator library alone against MXNet's op, at several thread counts.

    python -m benchmarks.kernel_ops [--threads 1 2] [--calls 30] [--ops layer_norm,softmax,dropout]
                                    [--dtype float32 bfloat16] [--repeats 1]

For each thread count and dtype, a fresh process (``OMP_NUM_THREADS`` set before MXNet loads)
builds each op at BERT-base batch 8, sequence 128 shapes: LayerNorm over (1024, 768),
softmax with lengths over (96, 128, 128) (lengths in [64, 128]), Dropout p=0.1 over
(1024, 3072). MXNet's op and the kernel rule's graph of it (``kernel_rule.apply_kernels``: the
library op, its input copies of gamma and beta and, for Dropout, the training flag; data comes
through an identity, as from the layer before in a network) run as a hybridized
``SymbolBlock`` (``static_alloc=True, static_shape=True``), forward and backward under
``autograd.record()``, ``--calls`` times after 5 warm-up calls. ``bfloat16`` (only where
``mxmp.lp_kernels_available('bfloat16')``, where converted graphs run the library's bfloat16
ops): bfloat16 data, both graphs mxmp's conversion (``mxmp.convert_symbol``, float32 output as
in every converted graph; LayerNorm's gamma and beta float32, the master parameters): MXNet's
op, which has no bfloat16 kernel, in float32 between casts (``Policy(kernels='mxnet')``), and
the library op in bfloat16 (the default); data comes through a Reshape to its own shape
(MXNet's identity copies bfloat16 at a third of float32's speed).

Beside each block's time, the op's own: a second fresh process per thread count and dtype,
with bulk execution off (``MXNET_EXEC_BULK_EXEC_TRAIN=0``: each operator its own engine call),
runs the same blocks ``--calls`` times after the warm-up under MXNet's profiler
(``profile_all``, ``aggregate_stats``) and reads, from its aggregate table, the op's forward
node and its backward node (``OP_NAMES``: ``mxmp_dropout`` and ``_backward_mxmp_dropout``,
MXNet's ``Dropout`` and ``_backward_Dropout``, ...; the library graph's other nodes, such as
Dropout's training flag, MXNet's ``Dropout`` named ``mxmp_train_flag``, are not counted): their
mean and their minimum ms per call, forward + backward. The block's time also holds the nodes
around the op (the input identity, the head gradient's fill, the output's allocation, the
casts of bfloat16 graphs), which do not scale with threads; the op's own time shows the op's
scaling apart from them.

For float32, the same process also times the block's surroundings alone: the identity that
brings data, the head gradient's fill and the data gradient, without the op. "Op in block" is
the block's median less the surroundings' median (and minimum less minimum), per process: the
op's share of the block with the MXNet nodes that every block holds taken out, the op's own
extra nodes (the kernel rule's ties, copies of gamma and beta, Dropout's flag) kept in. Not for
bfloat16 ('-'): there the surroundings hold the cast to the float32 output, whose time depends
on what it reads (measured: the surroundings alone took more than the block less the op alone).

The table gives, for each, the median (and the minimum) ms per call of the block, the median
of the surroundings, the op in block, the mean (and the minimum) of the op alone, and the
speed-up from the first thread count to each other. ``--repeats R`` runs every process R times,
the thread counts interleaved (1, 2, 1, 2, ...), and gives the median over the processes of
each figure (of the minima: the minimum; the JSON's ``per_process`` holds each process's
block medians): a 2-vCPU virtual machine's figures move from process
to process by more than the op's own spread (docs/benchmark.md, "The op in its block").
The machine's load average is printed with it: on a shared machine the figures are indicative
only (docs/benchmark.md, "mxmp's operator library, op by op").
"""
import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SHAPES = {'layer_norm': 'LayerNorm (1024x768)',
          'softmax': 'softmax with lengths (96x128x128)',
          'dropout': 'Dropout p=0.1 (1024x3072)'}

#: The profiler's names of each op's forward and backward node, per kernels.
OP_NAMES = {
    'layer_norm': {'MXNet': ('LayerNorm', '_backward_LayerNorm'),
                   'mxmp': ('mxmp_layer_norm', '_backward_mxmp_layer_norm')},
    'softmax': {'MXNet': ('softmax', '_backward_softmax'),
                'mxmp': ('mxmp_softmax', '_backward_mxmp_softmax')},
    'dropout': {'MXNet': ('Dropout', '_backward_Dropout'),
                'mxmp': ('mxmp_dropout', '_backward_mxmp_dropout')}}


def _graphs(mx, op, dtype='float32'):
    """(MXNet's symbol, the library graph's symbol, input names, input arrays, whether each
    input gets a gradient) of one op in ``dtype`` ('float32' or 'bfloat16': data and output)."""
    from mxmp._src.graph.kernel_rule import apply_kernels
    from mxmp._src.graph.symbol_json import dump, load
    from mxnet.contrib.amp.amp import bfloat16
    rng = np.random.RandomState(0)
    low = dtype == 'bfloat16'
    # data reaches the op through an identity, as from the previous layer in a network (the
    # kernel rule copies a graph variable, not an op's output); both graphs run it. bfloat16:
    # a Reshape to its own shape (MXNet's identity copies bfloat16 at a third of float32's
    # speed, 3.4 ms at 1024x3072: it would hide the op)
    shape = {'layer_norm': (1024, 768), 'softmax': (96, 128, 128)}.get(op, (1024, 3072))
    data = (mx.sym.reshape(mx.sym.var('data'), shape=shape, name='prev') if low else
            _around(mx))
    if op == 'layer_norm':
        names = ['data', 'gamma', 'beta']
        sym = mx.sym.LayerNorm(data, mx.sym.var('gamma'), mx.sym.var('beta'), name='op')
        arrays = [rng.normal(size=(1024, 768)), rng.uniform(0.5, 2, 768), rng.normal(size=768)]
        dtypes = ['float32'] * 3
    elif op == 'softmax':
        names = ['data', 'length']
        sym = mx.sym.softmax(data, length=mx.sym.var('length'), axis=-1,
                             use_length=True, name='op')
        arrays = [rng.normal(size=(96, 128, 128)), rng.randint(64, 129, size=(96, 128))]
        dtypes = ['float32', 'int32']
    else:
        names = ['data']
        sym = mx.sym.Dropout(data, p=0.1, name='op')
        arrays = [rng.normal(size=(1024, 3072))]
        dtypes = ['float32']
    if low:
        # mxmp's conversion of the graph for bfloat16 data, with MXNet's op
        # (Policy(kernels='mxnet'): float32 between casts) and with the library's
        import mxmp
        convert = functools.partial(mxmp.convert_symbol, data_dtypes={'data': bfloat16},
                                    data_names=names)
        lib = convert(sym, policy=mxmp.Policy('bfloat16'))
        sym = convert(sym, policy=mxmp.Policy('bfloat16', kernels='mxnet'))
    else:
        lib = dump(apply_kernels(load(sym), 'auto'))
    nds = [mx.nd.array(a, dtype=t) for a, t in zip(arrays, dtypes)]
    if low:
        nds[0] = mx.nd.amp_cast(nds[0], dtype=bfloat16)
    return sym, lib, names, nds, [t == 'float32' for t in dtypes]


def _around(mx):
    """Data's path into a float32 block, its identity: the block's surroundings without the op
    when it is timed alone (its input is the block's data, ``_graphs``'s first array)."""
    return mx.sym.identity(mx.sym.var('data'), name='prev')


def _time(mx, sym, names, arrays, calls, grad=None, profile=False):
    """[median, min] ms per call of the block, forward + backward; ``profile``: the text of
    MXNet's aggregate profile of the timed calls instead."""
    from mxnet import autograd, gluon
    block = gluon.SymbolBlock(sym, [mx.sym.var(n) for n in names])
    block.hybridize(static_alloc=True, static_shape=True)
    for a, g in zip(arrays, grad or [a.dtype == np.float32 for a in arrays]):
        if g:
            a.attach_grad()
    times = []
    for i in range(calls + 5):
        if profile and i == 5:
            mx.nd.waitall()
            mx.profiler.set_state('run')
        start = time.perf_counter()
        with autograd.record():
            out = block(*arrays)
        out.backward()
        mx.nd.waitall()
        if i >= 5:
            times.append(1e3 * (time.perf_counter() - start))
    if profile:
        mx.profiler.set_state('stop')
        return mx.profiler.dumps(reset=True)
    return [statistics.median(times), min(times)]


def op_ms(dump, op, kernels, calls):
    """The op's own ms per call in one profile: [mean, min] of its forward node plus its
    backward node.

    Args:
        dump (str): ``mx.profiler.dumps()`` of ``calls`` forward + backward calls of one block
            (``aggregate_stats=True``).
        op (str): a key of :data:`SHAPES`.
        kernels (str): 'MXNet' or 'mxmp' (the node names: :data:`OP_NAMES`).
        calls (int): the calls profiled (> 0).

    Returns:
        list: [total ms / calls of both nodes, the forward's minimum + the backward's minimum];
        None where the profile lacks either node (each must run once per call).

    Raises:
        ValueError: ``dump`` is not an aggregate profile (benchmarks.profile.parse_aggregate).
    """
    from .profile import parse_aggregate
    rows = parse_aggregate(dump).get('operator', {})
    nodes = [rows.get(name) for name in OP_NAMES[op][kernels]]
    if any(r is None or r['count'] != calls for r in nodes):
        return None
    return [sum(r['total_ms'] for r in nodes) / calls, sum(r['min_ms'] for r in nodes)]


def worker(ops, calls, dtype='float32', profile=False):
    """One thread count (the process's ``OMP_NUM_THREADS``) and dtype: {op: {kernels:
    [median, min] ms}} of the blocks, kernels 'MXNet', 'mxmp' and, for float32, 'around' (the
    surroundings, :func:`_around`); ``profile`` (bulk execution off in the environment): {op:
    {kernels: [mean, min] ms or None}} of the op's own nodes (:func:`op_ms`)."""
    import mxnet as mx
    import mxmp
    from mxmp._src.kernels.build import load_library
    if load_library() is None:
        raise SystemExit("mxmp's operator library does not build here")
    if dtype == 'bfloat16' and not mxmp.lp_kernels_available('bfloat16'):
        raise SystemExit('--dtype bfloat16: this CPU has no bfloat16 kernels (mxmp check-kernels)'
                         "; the library's bfloat16 ops run in converted graphs only where it has")
    if profile:
        mx.profiler.set_config(profile_all=True, aggregate_stats=True)
    res = {}
    for op in ops:
        sym, lib, names, arrays, grad = _graphs(mx, op, dtype)
        res[op] = {}
        for kernels, graph in (('MXNet', sym), ('mxmp', lib)):
            got = _time(mx, graph, names, arrays, calls, grad, profile)
            res[op][kernels] = op_ms(got, op, kernels, calls) if profile else got
        if not profile and dtype == 'float32':
            res[op]['around'] = _time(mx, _around(mx), names[:1], arrays[:1], calls,
                                      grad[:1])
    return res


#: The table's four figures per op, each at every thread count.
COLUMNS = ('block', 'surroundings', 'op in block', 'op alone')


def combine(figures):
    """One figure from several processes' [central, min] pairs (ms): [the median of the
    central values, the minimum of the minima]; None where any process has none."""
    if any(f is None for f in figures):
        return None
    return [statistics.median(f[0] for f in figures), min(f[1] for f in figures)]


def op_in_block(block, around):
    """The op's share of its block in one process: [block median - surroundings median, block
    minimum - surroundings minimum] (ms); each pair as ``_time`` returns it."""
    return [block[0] - around[0], block[1] - around[1]]


def _cell(ms, first):
    """'median (min)' and the speed-up cell from the first thread count's figures (a speed-up
    of a figure at or below 0 ms, as a difference can be: '-')."""
    if ms is None or first is None:
        return '-', '-'
    up = ['%.2fx' % (a / b) if a > 0 and b > 0 else '-' for a, b in zip(first, ms)]
    return '%.2f (%.2f)' % tuple(ms), '%s (%s)' % tuple(up)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--threads', type=int, nargs='+', default=[1, 2])
    p.add_argument('--calls', type=int, default=30)
    p.add_argument('--ops', default='layer_norm,softmax,dropout')
    p.add_argument('--dtype', nargs='+', default=['float32'], choices=['float32', 'bfloat16'],
                   help="data dtype(s) (bfloat16: the library's bfloat16 ops against MXNet's "
                   'float32 op between casts; only where the CPU has bfloat16 kernels)')
    p.add_argument('--repeats', type=int, default=1,
                   help='processes per thread count and dtype, the counts interleaved; each '
                   'figure is the median over them (default: 1)')
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--profile', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.calls < 1:
        p.error('--repeats and --calls must be at least 1')
    ops = [o for o in args.ops.split(',') if o]
    bad = [o for o in ops if o not in SHAPES]
    if bad:
        p.error('unknown op(s) %s: choose from %s' % (', '.join(bad), ', '.join(SHAPES)))
    if args.worker:
        print(json.dumps(worker(ops, args.calls, args.dtype[0], args.profile)))
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from .profile import BULK_OFF
    runs = {}   # (dtype, threads, profile) -> the workers' results, one per process
    for dtype in args.dtype:
        for _ in range(args.repeats):
            for n in args.threads:
                for profile in (False, True):
                    env = dict(os.environ, OMP_NUM_THREADS=str(n),
                               PYTHONPATH=root + os.pathsep + os.environ.get('PYTHONPATH', ''))
                    if profile:
                        env.update(BULK_OFF)
                    proc = subprocess.run(
                        [sys.executable, '-m', 'benchmarks.kernel_ops', '--worker', '--calls',
                         str(args.calls), '--ops', ','.join(ops), '--dtype', dtype] +
                        (['--profile'] if profile else []),
                        capture_output=True, text=True, env=env, cwd=root)
                    if proc.returncode != 0:
                        raise SystemExit(proc.stderr[-2000:])
                    runs.setdefault((dtype, n, profile), []).append(
                        json.loads(proc.stdout.strip().splitlines()[-1]))
    results, own, inside = {}, {}, {}
    for (dtype, n, profile), got in runs.items():
        into = own if profile else results
        into.setdefault(dtype, {})[n] = {op: {k: combine([g[op][k] for g in got])
                                              for k in got[0][op]} for op in ops}
        if not profile:
            inside.setdefault(dtype, {})[n] = {op: {k: combine([op_in_block(g[op][k], g[op][
                'around']) for g in got]) if 'around' in got[0][op] else None
                for k in ('MXNet', 'mxmp')} for op in ops}
    first = args.threads[0]
    print('load average %s; DNNL_MAX_CPU_ISA=%s; %d calls, forward + backward, %d process(es) '
          'per figure (median over them; of minima, the minimum): the block, median (min) ms; '
          'its surroundings without the op, median (min) ms; the op in the block (the block less '
          "its surroundings, per process), median (min) ms; the op alone (MXNet's profiler, bulk "
          'execution off: its forward and backward nodes), mean (min) ms'
          % (' '.join('%.2f' % v for v in os.getloadavg()),
             os.environ.get('DNNL_MAX_CPU_ISA', '(unset)'), args.calls, args.repeats))
    head = ['op', 'dtype', 'kernels']
    for what in COLUMNS:
        head += ['%s, %d thread%s ms' % (what, n, '' if n == 1 else 's') for n in args.threads]
        head += ['%s, %d -> %d threads' % (what, first, n) for n in args.threads[1:]]
    print('| ' + ' | '.join(head) + ' |')
    print('|' + '---|' * 3 + '---:|' * (len(head) - 3))
    for op in ops:
        for dtype in args.dtype:
            for kernels in ('MXNet', 'mxmp'):
                label = kernels
                if dtype == 'bfloat16':
                    label += ' (float32 between casts)' if kernels == 'MXNet' else ' (bfloat16)'
                cells = [SHAPES[op], dtype, label]
                for table, key in ((results, kernels), (results, 'around'), (inside, kernels),
                                   (own, kernels)):
                    ms = [table[dtype][n][op].get(key) for n in args.threads]
                    pairs = [_cell(t, ms[0]) for t in ms]
                    cells += [c for c, _ in pairs] + [r for _, r in pairs[1:]]
                print('| ' + ' | '.join(cells) + ' |')
    # each process's block medians, for the spread between processes
    spread = {dtype: {n: {op: {k: [g[op][k][0] for g in runs[(dtype, n, False)]]
                               for k in runs[(dtype, n, False)][0][op]} for op in ops}
                      for n in args.threads} for dtype in args.dtype}
    print(json.dumps({'threads': args.threads, 'repeats': args.repeats, 'results': results,
                      'op_in_block': inside, 'op_alone': own, 'per_process': spread}))


if __name__ == '__main__':
    main()
