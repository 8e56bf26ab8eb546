"""Peak RSS and step time of a few mxmp training steps, to try one lever per process.

``python -m benchmarks.train_rss --model resnet50_v1 --batch-size 16 [--cast-params]
[--fp32-ops OP ...]`` converts the GluonCV model with ``mxmp.convert`` (bfloat16; emulated where
the kernels are missing; ``--fp32-ops``: ops moved to float32 by the policy), runs ``--steps``
SGD-with-momentum steps with :class:`mxmp.Trainer` on one random batch, and prints the
process's peak RSS (``ru_maxrss``, MiB), the median time of the steps after the first two
(images/s) and the losses. Set environment variables (e.g. ``MXNET_MKLDNN_CACHE_NUM``) on the
command line to compare one lever at a time. One process, one configuration: for speed, run the
variants alternately several times (the benchmark's interleaving is not done here).
"""
import argparse
import resource
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='resnet50_v1')
    p.add_argument('--batch-size', type=int, default=16)
    p.add_argument('--input-size', type=int, default=224)
    p.add_argument('--classes', type=int, default=1000)
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--cast-params', action='store_true')
    p.add_argument('--fp32-ops', nargs='*', default=(), help='ops the policy keeps in float32')
    args = p.parse_args(argv)
    import mxnet as mx
    from mxnet import autograd, gluon
    from gluoncv.model_zoo import get_model
    import mxmp
    mx.random.seed(0)
    rng = np.random.RandomState(0)
    net = get_model(args.model, pretrained=False, classes=args.classes)
    net.initialize(mx.init.Xavier(magnitude=2))
    size = args.input_size
    x = mx.nd.array(rng.uniform(-1, 1, (args.batch_size, 3, size, size)))
    y = mx.nd.array(rng.randint(0, args.classes, args.batch_size))
    policy = mxmp.Policy('bfloat16', emulate=not mxmp.lp_kernels_available('bfloat16'),
                         fp32_ops=tuple(args.fp32_ops))
    block = mxmp.convert(net, cast_params=args.cast_params, policy=policy)
    trainer = mxmp.Trainer(block.collect_params(), 'sgd',
                           {'learning_rate': 0.01, 'momentum': 0.9})
    block.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, seconds = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(block(x), y)
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        trainer.step(args.batch_size)
        losses.append(float(loss.mean().asscalar()))  # synchronises: the step is done
        seconds.append(time.perf_counter() - start)
    mx.nd.waitall()
    timed = seconds[2:]
    print('%s batch %d cast_params %s fp32_ops %s: peak RSS %.0f MiB; %s; losses %s' % (
        args.model, args.batch_size, args.cast_params, ','.join(args.fp32_ops) or '-',
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        '%.2f img/s (median of %d steps)' % (args.batch_size / np.median(timed), len(timed))
        if timed else 'no timed steps (--steps > 2)', ', '.join('%.4f' % v for v in losses)))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
