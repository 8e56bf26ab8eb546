"""How far oneDNN-fused bfloat16 inference is from float32, against unfused bfloat16.

For each seed: a freshly initialized GluonCV model (no pretrained weights), its BatchNorm running
statistics taken from data by ``--stat-passes`` float32 training passes on uniform(-1, 1)
batches of 8 (on CPU, MXNet updates them in the backward pass); then one batch of 4 images runs
through the float32 net, through ``mxmp.convert(net, 'bfloat16', fuse_inference=False)`` and
``fuse_inference=True`` (both hybridized), and through the float32 net fused by MXNet
(``hybridize(backend='MKLDNN')``). Prints max|y - y32| / max|y32| for each.

Needs the real bfloat16 kernels (a CPU with avx512_bf16 or AMX); elsewhere it exits with a
message. ``--stat-passes 0`` keeps the initial statistics (running variance 1), where fusion
loses far more accuracy.

Run: ``python scripts/measure_fused_accuracy.py mobilenet1.0 [--size 64] [--seeds 0 1 2]``.
"""
import argparse
import sys

import mxnet as mx
import numpy as np
from gluoncv.model_zoo import get_model
from mxnet import autograd

import mxmp


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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('model', help='GluonCV model name, e.g. mobilenet1.0, resnet18_v1')
    parser.add_argument('--size', type=int, default=64, help='image side in pixels (default 64)')
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--stat-passes', type=int, default=30,
                        help='float32 training passes that set BatchNorm statistics (default 30)')
    args = parser.parse_args(argv)
    if not mxmp.lp_kernels_available('bfloat16'):
        sys.exit('this CPU has no bfloat16 kernels (avx512_bf16/AMX): nothing to measure')
    for seed in args.seeds:
        row = measure(args.model, args.size, seed, args.stat_passes)
        print('%s seed %d: %s' % (args.model, seed,
                                  ', '.join('%s %.4g' % kv for kv in row.items())), flush=True)


if __name__ == '__main__':
    main()
