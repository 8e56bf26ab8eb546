"""Hard-swish in bfloat16 or float32? GluonCV mobilenetv3_small, converted three ways.

For each seed: a freshly initialized mobilenetv3_small (no pretrained weights needed), one batch
of N(0, 1) images; the converted net runs first (MXNet 1.9.1 cannot cast a depthwise weight that
oneDNN reordered in a float32 forward), then the float32 net on the same batch. Prints the
relative error of the logits (max|y - y32| / max|y32|) and the number of casts of each graph:

* mxmp's default bfloat16 policy;
* the same with hard-swish/hard-sigmoid's ops (_plus_scalar, clip, _div_scalar, elemwise_mul)
  in float32 (``Policy(fp32_ops=...)``);
* the same with only ``_plus_scalar`` in float32 (the ops after it follow into float32);
* ``mxnet.contrib.amp.convert_hybrid_block`` (bfloat16).

Run: ``python -m benchmarks.hard_swish [--seeds 0 1 2] [--batch 4] [--size 224]``.
"""
import argparse

import mxnet as mx
import numpy as np
from gluoncv.model_zoo import get_model

import mxmp

HARD_SWISH_OPS = ('_plus_scalar', 'clip', '_div_scalar', 'elemwise_mul')


def _net(seed):
    mx.random.seed(seed)
    net = get_model('mobilenetv3_small', pretrained=False)
    net.initialize(mx.init.Xavier())
    return net


def _err(y, ref):
    y, ref = y.astype(np.float64), ref.astype(np.float64)
    return float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))


def _casts(sym):
    text = sym.tojson(remove_amp_cast=False) if hasattr(sym, 'tojson') else sym
    return text.count('"amp_cast"') + text.count('"amp_multicast"')


def measure(seed, batch, size, emulate):
    x = mx.nd.array(np.random.RandomState(seed).normal(size=(batch, 3, size, size)))
    out = {}
    variants = {'mxmp': (), 'mxmp hard-swish float32': HARD_SWISH_OPS,
                'mxmp _plus_scalar float32': ('_plus_scalar',), 'contrib.amp': None}
    for name, fp32 in variants.items():
        net = _net(seed)
        if name == 'contrib.amp':
            from mxnet.contrib import amp
            net.hybridize()
            net(x)  # contrib.amp converts a traced, hybridized block
            conv = amp.convert_hybrid_block(net, target_dtype='bfloat16', ctx=mx.cpu())
            sym = conv._cached_graph[1]  # pylint: disable=protected-access
            ref_net = _net(seed)
        else:
            policy = mxmp.Policy('bfloat16', fp32_ops=fp32, emulate=emulate)
            ref = net(x).asnumpy()
            conv = mxmp.convert(net, policy=policy, emulate=emulate)
            ref_net = None
        y = conv(x).asnumpy()
        if ref_net is not None:
            ref = ref_net(x).asnumpy()
        else:
            sym = mxmp.converted_graph(conv)
        out[name] = (_err(y, ref), _casts(sym))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    p.add_argument('--batch', type=int, default=4)
    p.add_argument('--size', type=int, default=224)
    args = p.parse_args()
    emulate = not mxmp.lp_kernels_available('bfloat16')
    print('real bfloat16 kernels: %s' % (not emulate))
    for seed in args.seeds:
        for name, (err, casts) in measure(seed, args.batch, args.size, emulate).items():
            print('seed %d  %-26s logits rel. error %.4f  casts %d' % (seed, name, err, casts))


if __name__ == '__main__':
    main()
