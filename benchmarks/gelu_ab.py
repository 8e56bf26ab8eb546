"""GELU alone, MXNet's ``LeakyReLU(act_type='gelu')`` against mxmp's ``mxmp_gelu``, paired.

    OMP_NUM_THREADS=1 python -m benchmarks.gelu_ab [--calls 30] [--dtypes float32 bfloat16]

At BERT-base batch 8, sequence 128 (the feed-forward's (1024, 3072)), each op runs as a
hybridized ``SymbolBlock`` (``static_alloc=True, static_shape=True``; data through an identity,
as from the FullyConnected before it), forward and backward under ``autograd.record()``; the
two graphs alternate call by call in one process (robust to a shared machine's load drifting),
``--calls`` times each after 5 warm-up calls. bfloat16 only where the real kernels run
(:func:`mxmp.lp_kernels_available`). Prints the median and minimum ms per call and the load
average: on a shared machine the figures are indicative only.
"""
import argparse
import os
import statistics
import time

import numpy as np


def _block(mx, sym, dtype):
    from mxnet import gluon
    block = gluon.SymbolBlock(sym, [mx.sym.var('data', dtype=dtype)])
    block.hybridize(static_alloc=True, static_shape=True)
    return block


def run(calls, dtypes):
    """{dtype: {'MXNet' or 'mxmp': [median, min, median CPU] ms per forward + backward call}}
    (CPU: the process's CPU time, all threads: less sensitive to other processes' load than
    wall time)."""
    import mxnet as mx
    from mxnet import autograd
    import mxmp
    from mxmp._src.dtypes import mx_dtype
    from mxmp._src.graph.kernel_rule import apply_kernels
    from mxmp._src.graph.symbol_json import dump, load
    from mxmp._src.kernels.build import load_library
    if load_library() is None:
        raise SystemExit("mxmp's operator library does not build here")
    sym = mx.sym.LeakyReLU(mx.sym.identity(mx.sym.var('data'), name='prev'), act_type='gelu',
                           name='op')
    graphs = {'MXNet': sym, 'mxmp': dump(apply_kernels(load(sym), 'all'))}   # GELU: opt-in
    res = {}
    for dtype in dtypes:
        if dtype == 'bfloat16' and not mxmp.lp_kernels_available('bfloat16'):
            continue
        x = mx.nd.array(np.random.RandomState(0).normal(size=(1024, 3072)))
        x = mx.nd.amp_cast(x, dtype=mx_dtype(dtype)) if dtype != 'float32' else x
        x.attach_grad()
        blocks = {k: _block(mx, g, mx_dtype(dtype)) for k, g in graphs.items()}
        times = {k: [] for k in blocks}
        cpu = {k: [] for k in blocks}
        for i in range(calls + 5):
            for name, block in blocks.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                with autograd.record():
                    out = block(x)
                out.backward()
                mx.nd.waitall()
                if i >= 5:
                    times[name].append(1e3 * (time.perf_counter() - start))
                    cpu[name].append(1e3 * (time.process_time() - start_cpu))
        res[dtype] = {k: [statistics.median(t), min(t), statistics.median(cpu[k])]
                      for k, t in times.items()}
    return res


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--calls', type=int, default=30)
    p.add_argument('--dtypes', nargs='+', default=['float32', 'bfloat16'],
                   choices=['float32', 'bfloat16'])
    args = p.parse_args(argv)
    res = run(args.calls, args.dtypes)
    print('OMP_NUM_THREADS=%s, load average %s; median (min) ms of %d alternating calls, '
          'forward + backward, (1024, 3072)' % (os.environ.get('OMP_NUM_THREADS', '(unset)'),
                                               ' '.join('%.2f' % v for v in os.getloadavg()),
                                               args.calls))
    print('| dtype | MXNet | mxmp | MXNet / mxmp (median) | CPU ms MXNet / mxmp (median) |')
    print('|---|---:|---:|---:|---:|')
    for dtype, r in res.items():
        print('| %s | %.2f (%.2f) | %.2f (%.2f) | %.2fx | %.2f / %.2f |' % (
            dtype, r['MXNet'][0], r['MXNet'][1], r['mxmp'][0], r['mxmp'][1],
            r['MXNet'][0] / r['mxmp'][0], r['MXNet'][2], r['mxmp'][2]))


if __name__ == '__main__':
    main()
