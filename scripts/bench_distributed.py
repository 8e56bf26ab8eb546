#!/usr/bin/env python3
"""Throughput of mxmp.Trainer over MXNet's kvstore, and the gradient bytes each worker pushes.

One process: ``python scripts/bench_distributed.py --kvstore none``. Several workers on this
machine (loopback): under ``scripts/launch_local.py``::

    python scripts/launch_local.py -n 2 -s 1 --timeout 600 --env OMP_NUM_THREADS=1 -- \\
        python scripts/bench_distributed.py --kvstore dist_sync --grad-dtype float16

With Horovod (``mxmp.horovod.DistributedTrainer``, no kvstore, no server)::

    horovodrun --gloo -np 2 -H localhost:2 \
        python scripts/bench_distributed.py --kvstore horovod --grad-dtype float16

Model: an MLP 784-1024-1024-10 (1.86 M parameters) on synthetic data, ``--dtype bfloat16``
(``mxmp.convert(..., emulate=True)`` unless real bfloat16 kernels run here) or ``float32``;
SGD with momentum, dynamic loss scaling. Every worker trains on ``--batch-size`` rows per step;
the global batch is ``batch_size * num_workers``.

Output: one JSON line per worker (rank 0 first to finish prints first) with ``img_per_sec``
(the global batch per step time: every worker waits for the others in dist_sync, so each
worker's number is the job's), ``step_ms`` (median over ``--steps`` after ``--warmup``),
``bytes_pushed_per_step`` (per worker: the sum over Parameters of elements x bytes of the
gradient exchange dtype; dist_sync pulls the same amount back) and the trainer's settings.
"""
import argparse
import json
import logging
import os
import statistics
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--kvstore', default='none',
                        help="'none' (no kvstore), 'local', 'dist_sync', ..., or 'horovod' "
                             "(under horovodrun; default none)")
    parser.add_argument('--dtype', choices=('bfloat16', 'float32'), default='bfloat16')
    parser.add_argument('--grad-dtype', choices=('float32', 'float16'), default=None,
                        help='dtype of the gradient exchange (mxmp.Trainer grad_dtype); '
                             'default: the gradients\' own dtype (float32 here)')
    parser.add_argument('--batch-size', type=int, default=64, help='rows per worker per step')
    parser.add_argument('--hidden', type=int, default=1024)
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--warmup', type=int, default=3)
    return parser.parse_args(argv)


def bytes_pushed(trainer, kv):
    """Gradient bytes one worker pushes per step (0 without a kvstore)."""
    if kv is None:
        return 0
    if hasattr(trainer, 'bytes_pushed_per_step'):
        return trainer.bytes_pushed_per_step()
    return sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize   # float32 Parameters
               for p in trainer._params if p.grad_req != 'null')


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import mxnet as mx
    from mxnet import autograd, gluon, nd
    import mxmp

    if args.kvstore == 'horovod':   # imported only here: mxmp does not need Horovod
        import horovod.mxnet as hvd
        hvd.init()
        kv, rank, workers = 'horovod', hvd.rank(), hvd.size()
    else:
        kv = None if args.kvstore == 'none' else mx.kv.create(args.kvstore)
        rank = kv.rank if kv is not None else 0
        workers = kv.num_workers if kv is not None else 1
    mx.random.seed(0)
    net = gluon.nn.HybridSequential(prefix='bench_')
    with net.name_scope():
        net.add(gluon.nn.Dense(args.hidden, in_units=784, activation='relu'),
                gluon.nn.Dense(args.hidden, in_units=args.hidden, activation='relu'),
                gluon.nn.Dense(10, in_units=args.hidden))
    net.initialize(mx.init.Xavier())
    emulate = False
    if args.dtype == 'bfloat16':
        emulate = not mxmp.lp_kernels_available('bfloat16')
        net = mxmp.convert(net, 'bfloat16', emulate=emulate)
    net.hybridize(static_alloc=True, static_shape=True)
    extra = {'grad_dtype': args.grad_dtype} if args.grad_dtype else {}
    opt = {'learning_rate': 0.01, 'momentum': 0.9}
    if kv == 'horovod':
        from mxmp.horovod import DistributedTrainer
        trainer = DistributedTrainer(net.collect_params(), 'sgd', opt, loss_scaler='dynamic',
                                     **extra)
    else:
        trainer = mxmp.Trainer(net.collect_params(), 'sgd', opt, kvstore=kv,
                               loss_scaler='dynamic', **extra)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(rank)
    x = nd.array(rng.normal(size=(args.batch_size, 784)))
    y = nd.array(rng.randint(0, 10, size=args.batch_size))
    times = []
    for step in range(args.warmup + args.steps):
        tic = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        # dist_sync sums: divide by the global batch; Horovod's trainer averages by itself.
        trainer.step(args.batch_size * (1 if kv == 'horovod' else workers))
        nd.waitall()
        if step >= args.warmup:
            times.append(time.perf_counter() - tic)
    step_s = statistics.median(times)
    print(json.dumps({
        'rank': rank, 'workers': workers, 'kvstore': args.kvstore, 'dtype': args.dtype,
        'emulate': emulate, 'grad_dtype': args.grad_dtype or 'float32',
        'omp_threads': os.environ.get('OMP_NUM_THREADS'),
        'batch_per_worker': args.batch_size, 'step_ms': round(step_s * 1e3, 1),
        'img_per_sec': round(args.batch_size * workers / step_s, 1),
        'bytes_pushed_per_step': bytes_pushed(trainer, kv),
        'params': sum(int(np.prod(p.shape)) for p in net.collect_params().values()),
        'skipped_steps': trainer.skipped_steps}), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
