"""Inference speed of mxmp.freeze against the converted block, in one process, calls interleaved.

Builds the benchmark's workload (``benchmarks.workloads``: ``resnet50_v1`` batch 16 or
``bert_base`` batch 8, 128 tokens) twice with the same seed, prepares each copy as ``--a``
and ``--b`` say, and alternates their calls (after 2 warm-up calls each), so that the load of a
shared machine hits both alike. Variants: ``converted`` (``mxmp.convert(net, 'bfloat16')``,
hybridized with ``static_alloc``/``static_shape``: the default fused inference), ``frozen``
(the same, then ``mxmp.freeze``), ``frozen_unfused`` (``fuse_inference=False``, then
``mxmp.freeze``). Prints the best and the median milliseconds of each and their ratio (b/a).

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.freeze_speed resnet50_v1 --a converted
--b frozen --calls 10``.
"""
import argparse
import time

import mxnet as mx
import numpy as np

import mxmp
from benchmarks.workloads import workload_for

VARIANTS = ('converted', 'frozen', 'frozen_unfused')


def prepared(spec, variant):
    """The network of ``variant`` and its inputs (the workload's first batch)."""
    wl = workload_for(spec)
    mx.random.seed(0)
    net = wl.model()
    wl.initialize(net, mx, mx.cpu())
    xs = wl.batches(mx, spec['batch_size'], mx.cpu())[0][0]
    mxmp.convert(net, 'bfloat16', fuse_inference=False if variant.endswith('unfused') else 'auto')
    net.hybridize(static_alloc=True, static_shape=True)
    if variant.startswith('frozen'):
        net = mxmp.freeze(net, *xs)
    for _ in range(2):
        net(*xs).wait_to_read()
    return net, xs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('model', choices=('resnet50_v1', 'bert_base'))
    p.add_argument('--a', choices=VARIANTS, default='converted')
    p.add_argument('--b', choices=VARIANTS, default='frozen')
    p.add_argument('--calls', type=int, default=10)
    args = p.parse_args(argv)
    spec = dict(model=args.model, batch_size=16 if args.model == 'resnet50_v1' else 8,
                seq_len=128, input_size=224, classes=1000)
    runs = [prepared(spec, v) for v in (args.a, args.b)]
    times = [[], []]
    for _ in range(args.calls):
        for k, (net, xs) in enumerate(runs):
            start = time.perf_counter()
            net(*xs).wait_to_read()
            times[k].append(time.perf_counter() - start)
    best = [min(t) * 1e3 for t in times]
    median = [float(np.median(t)) * 1e3 for t in times]
    print('%s: %s best %.1f ms, median %.1f; %s best %.1f ms, median %.1f; %s/%s best %.3f, '
          'median %.3f' % (args.model, args.a, best[0], median[0], args.b, best[1], median[1],
                           args.b, args.a, best[1] / best[0], median[1] / median[0]))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
