#!/usr/bin/env python3
"""Worker of tests/kernels/test_layer_norm_kernel.py and test_dropout_kernel.py: mxmp's library
LayerNorm against MXNet's, its Dropout against Dropout's definition.

    python tests/kernels/kernels_worker.py kernel      # op-level comparisons
    python tests/kernels/kernels_worker.py dropout     # mxmp_dropout, op level and through the rule
    python tests/kernels/kernels_worker.py softmax     # mxmp_softmax with lengths against softmax
    python tests/kernels/kernels_worker.py grad-req    # grad_req 'add' and 'null' through the rule
    python tests/kernels/kernels_worker.py fallback    # no compiler: MXNet's LayerNorm runs

Runs in its own process (a kernel under test could crash the interpreter) and prints one JSON
line. ``kernel``: for float64 and float32, several shapes (last axis 1 to 1000) and seeds, the
forward output and the gradients of data, gamma and beta of ``mx.nd.mxmp_layer_norm`` and of
``mx.nd.LayerNorm`` on the same inputs, as ``max|lib - mxnet| / max|mxnet|``; and, for rows
whose mean is 1000x their spread, each kernel's float32 error against MXNet's float64 result.
"""
import json
import os
import sys

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import mxmp  # noqa: E402
from mxmp._src.kernels.build import load_library  # noqa: E402

SHAPES = [(2, 3, 8), (16, 768), (4, 7), (3, 33), (5, 1000), (1, 2, 3, 64), (6, 1)]


def _rel(a, b):
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())


def _run(fn, values, dtype, head):
    arrays = [mx.nd.array(v, dtype=dtype) for v in values]
    for a in arrays:
        a.attach_grad()
    with autograd.record():
        out = fn(*arrays)
    out.backward(mx.nd.array(head, dtype=dtype))
    return [out.asnumpy().astype(np.float64)] + [a.grad.asnumpy().astype(np.float64)
                                                 for a in arrays]


def _inputs(shape, seed, offset=0.0):
    rng = np.random.RandomState(seed)
    return ([rng.normal(size=shape) * 3 + offset, rng.uniform(0.5, 2, shape[-1]),
             rng.normal(size=shape[-1])], rng.normal(size=shape))


def kernel():
    if load_library() is None:
        return {'library': None}
    lib = lambda x, g, b: mx.nd.mxmp_layer_norm(x, g, b, eps=1e-5)[0]  # noqa: E731
    ref = lambda x, g, b: mx.nd.LayerNorm(x, g, b, eps=1e-5)  # noqa: E731
    rows = []
    for dtype in ('float64', 'float32'):
        for shape in SHAPES:
            for seed in (0, 1, 2):
                values, head = _inputs(shape, seed)
                got, want = _run(lib, values, dtype, head), _run(ref, values, dtype, head)
                rows.append({'dtype': dtype, 'shape': shape, 'seed': seed,
                             'errors': [_rel(a, b) for a, b in zip(got, want)],
                             'dtype_out': str(lib(*[mx.nd.array(v, dtype=dtype)
                                                    for v in values]).dtype)})
    offset = []
    for seed in (0, 1, 2):
        values, head = _inputs((64, 768), seed, offset=3000.0)
        exact = _run(ref, values, 'float64', head)
        offset.append({'lib': [_rel(a, b) for a, b in zip(_run(lib, values, 'float32', head),
                                                          exact)],
                       'mxnet': [_rel(a, b) for a, b in zip(_run(ref, values, 'float32', head),
                                                            exact)]})
    return {'rows': rows, 'offset': offset}


def _ln_net(grad_req, kernels):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(32, flatten=False, in_units=24), gluon.nn.LayerNorm(in_channels=32),
            gluon.nn.Dense(8, flatten=False, in_units=32))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    mx.random.seed(0)
    for name, p in net.collect_params().items():
        p.set_data(mx.nd.random.normal(shape=p.shape) * 0.3 + (1 if 'gamma' in name else 0))
    net.collect_params('.*gamma|.*beta').setattr('grad_req', grad_req)
    net = mxmp.convert(net, 'bfloat16', policy=mxmp.Policy('bfloat16', kernels=kernels))
    net.hybridize()
    return net


def grad_req():
    """Two backward passes with grad_req='add' on gamma and beta (the gradient must double),
    and one with grad_req='null' (frozen), through the kernel rule and through MXNet's kernel."""
    x = mx.nd.array(np.random.RandomState(0).normal(size=(4, 16, 24)))
    out = {}
    for kernels in ('auto', 'mxnet'):
        net = _ln_net('add', kernels)
        grads = []
        for _ in range(2):
            with autograd.record():
                loss = net(x).sum()
            loss.backward()
            grads.append({n.rsplit('_', 1)[-1]: p.grad().asnumpy().tolist() for n, p in
                          net.collect_params('.*gamma|.*beta').items()})
        frozen = _ln_net('null', kernels)
        with autograd.record():
            loss = frozen(x).sum()
        loss.backward()
        weight = [p for n, p in frozen.collect_params().items() if n.endswith('weight')][0]
        ops = [n['op'] for n in json.loads(mxmp.converted_graph(net).tojson())['nodes']]
        out[kernels] = {'grads': grads, 'frozen_weight_grad': weight.grad().asnumpy().tolist(),
                        'library_op': 'mxmp_layer_norm' in ops}
    return out


def fallback():
    """A machine without a compiler: the build fails, one warning, MXNet's LayerNorm stays."""
    import logging
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger('mxmp.kernels').addHandler(Keep())
    data = mx.sym.var('data')
    sym = mx.sym.LayerNorm(mx.sym.FullyConnected(data, num_hidden=16, flatten=False,
                                                 name='fc'), name='ln')
    # emulated where oneDNN has no bfloat16 kernels (an AVX2 CPU, DNNL_MAX_CPU_ISA=AVX2)
    conv = mxmp.convert_symbol(sym, 'bfloat16', emulate=not mxmp.lp_kernels_available('bfloat16'))
    ops = [n['op'] for n in json.loads(conv.tojson(remove_amp_cast=False))['nodes']]
    exe = conv.simple_bind(mx.cpu(), data=(2, 3, 8))
    exe.forward(is_train=True)
    return {'ops': ops, 'library': load_library(), 'warnings': records,
            'finite': bool(np.isfinite(exe.outputs[0].asnumpy()).all())}


def _dropout_op(x, flag, p, dtype, head, **attrs):
    arr = mx.nd.array(x, dtype=dtype)
    arr.attach_grad()
    with autograd.record():
        out = mx.nd.mxmp_dropout(arr, mx.nd.array([flag]), p=p, **attrs)[0]
    out.backward(mx.nd.array(head, dtype=dtype))
    return out.asnumpy().astype(np.float64), arr.grad.asnumpy().astype(np.float64)


def dropout():
    """mxmp_dropout on its own (training flag 0, inference flag 1) and through the kernel rule
    in a converted Gluon network (training under autograd.record, inference outside)."""
    if load_library() is None:
        return {'library': None}
    rows = []
    for dtype in ('float64', 'float32'):
        for shape in [(8, 128, 256), (7, 33), (3,)]:
            for p in (0.1, 0.5):
                rng = np.random.RandomState(0)
                x, head = rng.normal(size=shape), rng.normal(size=shape)
                y, dx = _dropout_op(x, 0.0, p, dtype, head)
                kept = y != 0
                yi, dxi = _dropout_op(x, 1.0, p, dtype, head)
                ya, _ = _dropout_op(x, 1.0, p, dtype, head, mode='always')
                rows.append({'dtype': dtype, 'shape': shape, 'p': p, 'n': int(kept.size),
                             'dropped': float(1 - kept.mean()),
                             'kept_err': _rel(y[kept], (x / (1 - p)).astype(dtype)[kept]),
                             'grad_err': _rel(dx, np.where(kept, head / (1 - p), 0)),
                             'inference_identity': bool((yi == x.astype(dtype)).all() and
                                                        (dxi == head.astype(dtype)).all()),
                             'always_drops': bool((ya == 0).any())})
    x = np.random.RandomState(1).normal(size=(1 << 20,))
    masks = []
    for seed in (5, 5, None):
        if seed is not None:
            mx.random.seed(seed)
        masks.append(_dropout_op(x, 0.0, 0.1, 'float32', x)[0] != 0)
    flat = masks[0].astype(np.float64)
    lags = [abs(float(np.corrcoef(flat[:-k], flat[k:])[0, 1])) for k in (1, 2, 16, 4096)]
    # through the rule
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, flatten=False, in_units=32), gluon.nn.Dropout(0.3))
    net.initialize(mx.init.Xavier())
    ref = gluon.nn.HybridSequential()
    ref.add(gluon.nn.Dense(64, flatten=False, in_units=32), gluon.nn.Dropout(0.3))
    ref.initialize(mx.init.Xavier())
    for (_, a), (_, b) in zip(sorted(net.collect_params().items()),
                              sorted(ref.collect_params().items())):
        b.set_data(a.data())
    net = mxmp.convert(net, 'bfloat16', policy=mxmp.Policy('bfloat16', kernels='all'))
    ref = mxmp.convert(ref, 'bfloat16', policy=mxmp.Policy('bfloat16', kernels='mxnet'))
    net.hybridize()
    ref.hybridize()
    data = mx.nd.array(np.random.RandomState(2).normal(size=(16, 8, 32)))
    infer_equal = bool((net(data).asnumpy() == ref(data).asnumpy()).all())
    with autograd.record():
        train = net(data)
    train.backward()
    dense_out = net[0](data).asnumpy()
    ops = [n['op'] for n in json.loads(mxmp.converted_graph(net).tojson())['nodes']]
    return {'rows': rows, 'same_seed_same_mask': bool((masks[0] == masks[1]).all()),
            'next_call_differs': float((masks[1] != masks[2]).mean()), 'lag_corr': lags,
            'rule': {'ops': ops, 'inference_equal': infer_equal,
                     'train_dropped': float((train.asnumpy() == 0).mean() -
                                            (dense_out == 0).mean()),
                     'train_n': int(dense_out.size),
                     'train_grad_finite': bool(np.isfinite(
                         net[0].weight.grad().asnumpy()).all())}}


def softmax():
    """mxmp_softmax(data, length, use_length=True) against MXNet's softmax with lengths, float64
    and float32, lengths from 0 to the full row; and each float32 result against float64."""
    if load_library() is None:
        return {'library': None}
    rows = []
    for shape in [(24, 32, 32), (4, 7), (2, 3, 128), (5, 1000)]:
        for seed in (0, 1, 2):
            rng = np.random.RandomState(seed)
            x, dy = rng.normal(size=shape) * 4, rng.normal(size=shape)
            length = rng.randint(0, shape[-1] + 1, size=shape[:-1])
            length.flat[0], length.flat[-1] = 0, shape[-1]
            res = {}
            for dtype in ('float64', 'float32'):
                for name, fn in (('lib', lambda a, l: mx.nd.mxmp_softmax(a, l, use_length=True)),
                                 ('mxnet', lambda a, l: mx.nd.softmax(a, length=l, axis=-1,
                                                                       use_length=True))):
                    a = mx.nd.array(x, dtype=dtype)
                    a.attach_grad()
                    with autograd.record():
                        y = fn(a, mx.nd.array(length, dtype='int32'))
                    y.backward(mx.nd.array(dy, dtype=dtype))
                    res[name, dtype] = (y.asnumpy().astype(np.float64),
                                        a.grad.asnumpy().astype(np.float64))
            exact = res['mxnet', 'float64']
            rows.append({'shape': shape, 'seed': seed,
                         'float64': [_rel(a, b) for a, b in zip(res['lib', 'float64'], exact)],
                         'float32': [_rel(a, b) for a, b in zip(res['lib', 'float32'],
                                                                 res['mxnet', 'float32'])],
                         'lib32_vs_64': [_rel(a, b) for a, b in zip(res['lib', 'float32'], exact)],
                         'mxnet32_vs_64': [_rel(a, b) for a, b in zip(res['mxnet', 'float32'],
                                                                      exact)],
                         'beyond_length_zero': bool(all(
                             (res['lib', 'float32'][k][r][int(length.flat[i]):] == 0).all()
                             for k in (0, 1) for i, r in enumerate(np.ndindex(*shape[:-1]))))})
    return {'rows': rows}


if __name__ == '__main__':
    print(json.dumps({'kernel': kernel, 'grad-req': grad_req, 'fallback': fallback,
                      'dropout': dropout, 'softmax': softmax}[
        sys.argv[1]]()))
