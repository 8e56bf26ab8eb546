"""Which rounding of BatchNorm-folded bfloat16 inference costs accuracy, emulated in float32.

A trained GluonCV network (``--params``, e.g. from ``python -m benchmarks.fused_accuracy
--save-params``) gets every Convolution -> BatchNorm pair folded in float32
(mxmp._src.graph.fold), then runs in float32 kernels (``MXNET_SUBGRAPH_BACKEND=NONE``) with one
rounding at a time switched on: the folded weights rounded to nearest bfloat16 once, or twice
(bfloat16 weight, then the product: what folding a ``cast_params=True`` weight does), or
truncated as MXNet 1.9.1's fused convolution does; the folded bias rounded or truncated; the
inputs of the convolutions (and of the classifier) rounded to bfloat16. Prints, per setting,
top-1 on the first 2,000 Fashion-MNIST test images, the predictions changed against float32 and
the rms logit error over the rms logit.

Run: ``python -m benchmarks.fold_rounding cifar_resnet20_v1 --params net.params``.
"""
import argparse
import os
import sys

os.environ['MXNET_SUBGRAPH_BACKEND'] = 'NONE'   # before MXNet binds anything: no fusion
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from gluoncv.model_zoo import get_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, 'scripts')]
from benchmarks.fused_accuracy import images  # noqa: E402
from prepare_fashion_mnist import DEFAULT_SRC  # noqa: E402  (a tool in scripts/)
from mxmp._src.graph.fold import fold_batchnorm, folded_values  # noqa: E402

#: setting -> (folded weight, folded bias, inputs rounded)
SETTINGS = {
    'float32 fold': ('none', 'none', False),
    'weights rounded once': ('once', 'none', False),
    'weights rounded twice': ('twice', 'none', False),
    'bias rounded': ('none', 'round', False),
    'inputs rounded': ('none', 'none', True),
    'all, rounded once (mxmp)': ('once', 'round', True),
    "all, truncated (MXNet's fold)": ('truncate', 'truncate', True),
}


def to_bfloat16(a, truncate=False):
    """float32 array -> bfloat16 values as float32: nearest (ties to even) or truncated."""
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    if not truncate:
        bits = bits + 0x7fff + ((bits >> 16) & 1)
    return ((bits >> 16) << 16).astype(np.uint32).view(np.float32)


def emulated(sym, params, weight, bias, round_inputs):
    """The folded graph with the chosen roundings, and its arguments (numpy float32)."""
    folded, folds = fold_batchnorm(sym)
    args = {}
    for fold in folds:
        w, b = (v.asnumpy() for v in folded_values(fold, lambda n: mx.nd.array(params[n])))
        if weight == 'twice':
            w = to_bfloat16(folded_values(fold._replace(weight='_w'), lambda n: mx.nd.array(
                to_bfloat16(params[fold.weight]) if n == '_w' else params[n]))[0].asnumpy())
        elif weight != 'none':
            w = to_bfloat16(w, truncate=weight == 'truncate')
        if bias != 'none':
            b = to_bfloat16(b, truncate=bias == 'truncate')
        args[fold.new_weight], args[fold.new_bias] = w, b
    if round_inputs:
        folded = _round_gemm_inputs(folded)
    return folded, args


def _round_gemm_inputs(sym):
    """``sym`` with the data input of every Convolution and FullyConnected rounded through
    bfloat16 (an amp_cast round trip), rebuilt node by node from its JSON."""
    import json
    from mxnet.contrib.amp.amp import bfloat16
    js = json.loads(sym.tojson())
    built = []
    for node in js['nodes']:
        attrs = node.get('attrs', {})
        if node['op'] == 'null':
            built.append([mx.sym.var(node['name'], **{k: v for k, v in attrs.items()
                                                     if k == '__shape__'})])
            continue
        ins = [built[i][k] for i, k, _ in node['inputs']]
        if node['op'] in ('Convolution', 'FullyConnected'):
            ins[0] = mx.sym.amp_cast(mx.sym.amp_cast(ins[0], dtype=bfloat16), dtype='float32')
        out = getattr(mx.sym, node['op'])(*ins, name=node['name'], **attrs)
        built.append([out[k] for k in range(len(out.list_outputs()))])
    return mx.sym.Group([built[i][k] for i, k, _ in js['heads']])


def run(sym, args, params, x):
    """Logits of ``x`` (numpy) through ``sym`` bound with ``args``, else ``params``."""
    exe = sym.simple_bind(mx.cpu(), data=(100,) + x.shape[1:], grad_req='null')
    for name, arr in list(exe.arg_dict.items()) + list(exe.aux_dict.items()):
        if name != 'data':
            arr[:] = args[name] if name in args else params[name]
    out = []
    for i in range(0, len(x), 100):
        exe.arg_dict['data'][:] = x[i:i + 100]
        out.append(exe.forward(is_train=False)[0].asnumpy())
    return np.concatenate(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('model', help='GluonCV model name, e.g. cifar_resnet20_v1')
    parser.add_argument('--params', required=True, help='its trained parameters (float32)')
    parser.add_argument('--src', default=DEFAULT_SRC, help='the Fashion-MNIST IDX files')
    parser.add_argument('--test-images', type=int, default=2000)
    args = parser.parse_args(argv)
    net = get_model(args.model, pretrained=False, classes=10)
    net.load_parameters(args.params)
    params = {k: p.data().asnumpy() for k, p in net.collect_params().items()}
    sym = net(mx.sym.var('data'))
    x, y = images(args.src, 'val', args.test_images)
    ref = run(sym, {}, params, x)
    print('float32: top-1 %.2f' % (100 * (ref.argmax(1) == y).mean()))
    for name, (weight, bias, inputs) in SETTINGS.items():
        out = run(*emulated(sym, params, weight, bias, inputs), params, x)
        print('%-30s top-1 %.2f, changed %.2f%%, rms error %.4f' % (
            name, 100 * (out.argmax(1) == y).mean(),
            100 * (out.argmax(1) != ref.argmax(1)).mean(),
            np.sqrt(((out - ref) ** 2).mean() / (ref ** 2).mean())), flush=True)


if __name__ == '__main__':
    main()
