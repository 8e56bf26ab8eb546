"""How far oneDNN-fused bfloat16 inference is from float32, against unfused bfloat16.

Two setups:

* ``--train-steps N`` (N > 0): a trained network. The GluonCV model is trained in float32 for N
  SGD steps (batch ``--batch-size``, learning rate 0.1 decayed linearly to 0, momentum 0.9,
  weight decay 1e-4, seeded)
  on Fashion-MNIST (Debian's ``dataset-fashion-mnist`` IDX files, 28x28, the gray channel
  replicated three times), then the first ``--test-images`` test images are classified by the
  float32 network and by ``mxmp.convert(net, 'bfloat16')`` as a user calls it (the default path:
  oneDNN-fused where the real kernels run), with ``fold_batchnorm=False`` (MXNet folds
  BatchNorm itself) and with ``fuse_inference=False``. Prints one JSON line per seed: top-1 (%)
  and predictions changed against float32 (%) of each path, and the training time.
* otherwise (random weights): for each seed a freshly initialized model, its BatchNorm running
  statistics taken from data by ``--stat-passes`` float32 training passes on uniform(-1, 1)
  batches of 8 (on CPU, MXNet updates them in the backward pass); one batch of 4 images at
  ``--size`` runs through the float32 net, ``mxmp.convert(net, 'bfloat16', fuse_inference=...)``
  unfused and fused, and MXNet's fused float32 net. Prints max|y - y32| / max|y32| for each.
  ``--stat-passes 0`` keeps the initial statistics (running variance 1).

The fused rows need the real bfloat16 kernels (avx512_bf16/AMX); elsewhere the random-weights
setup exits with a message and the trained setup reports the emulated default path (unfused).

Run: ``python -m benchmarks.fused_accuracy cifar_resnet20_v1 --train-steps 300 --seeds 0``
or ``python -m benchmarks.fused_accuracy mobilenet1.0 [--size 64] [--seeds 0 1 2]``.
"""
import argparse
import json
import os
import sys
import time

import mxnet as mx
import numpy as np
from gluoncv.model_zoo import get_model
from mxnet import autograd, gluon

import mxmp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'scripts'))
from prepare_fashion_mnist import DEFAULT_SRC, load_split  # noqa: E402  (a tool in scripts/)

#: Fashion-MNIST's pixel mean and standard deviation (of the 60,000 training images, /255).
MEAN, STD = 0.286, 0.353


def relative_error(y, ref):
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def measure(model, size, seed, stat_passes):
    mx.random.seed(seed)
    np.random.seed(seed)
    net = get_model(model, pretrained=False, classes=10)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(-1, 1, (4, 3, size, size))
    for _ in range(stat_passes):
        with autograd.record():
            y = net(mx.nd.random.uniform(-1, 1, (8, 3, size, size)))
        y.backward()
    ref = net(x).asnumpy()
    row = {}
    for fuse in (False, True):
        block = mxmp.convert(net, 'bfloat16', fuse_inference=fuse)
        block.hybridize(static_alloc=True, static_shape=True)
        row['bf16 fused' if fuse else 'bf16 unfused'] = relative_error(block(x).asnumpy(), ref)
    net.hybridize(static_alloc=True, static_shape=True, backend='MKLDNN')
    row['float32 fused'] = relative_error(net(x).asnumpy(), ref)
    return row


def images(src, split, count=None):
    """``(x, y)``: float32 (N, 3, 28, 28) normalized images and int labels of a split."""
    pixels, labels = load_split(src, split)
    pixels, labels = pixels[:count], labels[:count]
    x = (pixels.astype(np.float32) / 255 - MEAN) / STD
    return np.repeat(x[:, None], 3, axis=1), labels.astype(np.int64)


def train(model, steps, batch_size, seed, train_set):
    """A float32 GluonCV ``model`` trained ``steps`` SGD steps on ``train_set`` (seeded)."""
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    net = get_model(model, pretrained=False, classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), 'sgd',
                            {'learning_rate': 0.1, 'momentum': 0.9, 'wd': 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = train_set
    for step in range(steps):
        trainer.set_learning_rate(0.1 * (1 - step / steps))   # to 0 at the end: a settled net
        pick = rng.randint(0, len(x), batch_size)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x[pick])), mx.nd.array(y[pick]))
        loss.backward()
        trainer.step(batch_size)
    return net


def predict(net, x, batch=100):
    return np.concatenate([net(mx.nd.array(x[i:i + batch])).asnumpy().argmax(axis=1)
                           for i in range(0, len(x), batch)])


def measure_trained(model, steps, batch_size, seed, src, test_images, save_dir=None):
    """One JSON-able row: top-1 (%) and predictions changed against float32 (%) per path; the
    trained parameters kept in ``save_dir`` if given."""
    start = time.time()
    net = train(model, steps, batch_size, seed, images(src, 'train'))
    row = {'model': model, 'seed': seed, 'steps': steps, 'train_s': round(time.time() - start, 1),
           'real_kernels': mxmp.lp_kernels_available('bfloat16')}
    name = ('%s-seed%d.params' % (model, seed) if save_dir else
            'fused_accuracy_%d.params' % os.getpid())
    params = os.path.join(save_dir or os.environ.get('TMPDIR', '/tmp'), name)
    net.save_parameters(params)
    x, y = images(src, 'val', test_images)
    paths = {'float32': None, 'default': {}, 'fold_batchnorm=False': {'fold_batchnorm': False},
             'fuse_inference=False': {'fuse_inference': False}}
    reference = None
    for name, kwargs in paths.items():
        block = get_model(model, pretrained=False, classes=10)
        block.load_parameters(params)
        if kwargs is not None:
            block = mxmp.convert(block, 'bfloat16', **kwargs)
        block.hybridize(static_alloc=True, static_shape=True)
        pred = predict(block, x)
        reference = pred if reference is None else reference
        row[name] = {'top1': round(100 * float((pred == y).mean()), 2),
                     'changed': round(100 * float((pred != reference).mean()), 2)}
    if not save_dir:
        os.remove(params)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('model', help='GluonCV model name, e.g. cifar_resnet20_v1, mobilenet1.0')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--train-steps', type=int, default=0,
                        help='train on Fashion-MNIST this many steps first (default 0: random '
                             'weights)')
    parser.add_argument('--batch-size', type=int, default=64, help='training batch (default 64)')
    parser.add_argument('--test-images', type=int, default=2000,
                        help='test images classified (default 2000)')
    parser.add_argument('--src', default=DEFAULT_SRC, help='the Fashion-MNIST IDX files')
    parser.add_argument('--save-params', metavar='DIR',
                        help='keep each trained network as DIR/MODEL-seedN.params')
    parser.add_argument('--size', type=int, default=64,
                        help='random weights: image side in pixels (default 64)')
    parser.add_argument('--stat-passes', type=int, default=30,
                        help='random weights: float32 training passes that set BatchNorm '
                             'statistics (default 30)')
    args = parser.parse_args(argv)
    if args.train_steps > 0:
        for seed in args.seeds:
            print(json.dumps(measure_trained(args.model, args.train_steps, args.batch_size, seed,
                                             args.src, args.test_images, args.save_params)),
                  flush=True)
        return
    if not mxmp.lp_kernels_available('bfloat16'):
        sys.exit('this CPU has no bfloat16 kernels (avx512_bf16/AMX): nothing to measure')
    for seed in args.seeds:
        row = measure(args.model, args.size, seed, args.stat_passes)
        print('%s seed %d: %s' % (args.model, seed,
                                  ', '.join('%s %.4g' % kv for kv in row.items())), flush=True)


if __name__ == '__main__':
    main()
