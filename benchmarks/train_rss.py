"""Peak RSS of a few mxmp training steps, for trying memory levers one process at a time.

``python -m benchmarks.train_rss --model resnet50_v1 --batch-size 16 [--cast-params]``
converts the GluonCV model with ``mxmp.convert`` (bfloat16; emulated where the kernels are
missing), runs ``--steps`` SGD-with-momentum steps with :class:`mxmp.Trainer` on one random
batch, and prints the process's peak RSS (``ru_maxrss``, MiB) and the losses. Set environment
variables (e.g. ``MXNET_MKLDNN_CACHE_NUM``) on the command line to compare one lever at a time.
"""
import argparse
import resource

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='resnet50_v1')
    p.add_argument('--batch-size', type=int, default=16)
    p.add_argument('--input-size', type=int, default=224)
    p.add_argument('--classes', type=int, default=1000)
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--cast-params', action='store_true')
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
    block = mxmp.convert(net, 'bfloat16', cast_params=args.cast_params,
                         emulate=not mxmp.lp_kernels_available('bfloat16'))
    trainer = mxmp.Trainer(block.collect_params(), 'sgd',
                           {'learning_rate': 0.01, 'momentum': 0.9})
    block.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for _ in range(args.steps):
        with autograd.record():
            loss = loss_fn(block(x), y)
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        trainer.step(args.batch_size)
        losses.append(float(loss.mean().asscalar()))
    mx.nd.waitall()
    print('%s batch %d cast_params %s: peak RSS %.0f MiB; losses %s' % (
        args.model, args.batch_size, args.cast_params,
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        ', '.join('%.4f' % v for v in losses)))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
