#!/usr/bin/env python3
"""Worker of tests/kernels/test_contract.py and test_library_inference.py: runs one probe of
mxmp's operator library in its own process (a probe of the old library could crash it) and
prints one JSON line.

    python tests/kernels/library_worker.py contract            # the numerical contract
    python tests/kernels/library_worker.py inference           # partial inference, messages
    python tests/kernels/library_worker.py outputs             # bits of every output (threads)
"""
import hashlib
import json
import os
import sys

import numpy as np

import mxnet as mx
from mxnet import autograd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from mxmp._src.kernels.build import load_library  # noqa: E402


def contract():
    from mxmp._src.conformance.contract import CASES, run_contract
    return {'rows': [r for op in CASES for dtype in ('float32', 'bfloat16')
                     for r in run_contract(op, dtype=dtype)]}


def _shapes(res):
    return None if res is None else [[list(s) if s is not None else None for s in part]
                                     for part in res]


def _types(res):
    return [[None if t is None else np.dtype(t).name for t in part] for part in res]


def _try(fn):
    try:
        return {'ok': fn()}
    except mx.base.MXNetError as err:
        return {'error': str(err).strip().splitlines()[-1][:400] if str(err).strip() else ''}


def inference():
    sym = mx.sym
    out = {}
    # softmax with lengths on 1-D data: length (1,), as MXNet's softmax
    out['sm_1d_nd'] = _try(lambda: mx.nd.mxmp_softmax(
        mx.nd.array([1, 2, 3, 4, 5]), mx.nd.array([3], dtype='int32'),
        use_length=True).asnumpy().tolist())
    out['sm_1d_mxnet'] = mx.nd.softmax(mx.nd.array([1, 2, 3, 4, 5]),
                                       mx.nd.array([3], dtype='int32'), use_length=True,
                                       axis=-1).asnumpy().tolist()
    # (every input's number of axes known: MXNet 1.9.1's wrapper of library ops writes past
    # its shape buffer when an input's shape is wholly unknown, before the library is called)
    for name, fn in (('lib', lambda x, l: sym.mxmp_softmax(x, l, use_length=True)),
                     ('mxnet', lambda x, l: sym.softmax(x, l, use_length=True, axis=-1))):
        s = fn(sym.var('x'), sym.var('l', shape=(0,)))
        out['sm_shape_1d_%s' % name] = _try(lambda: _shapes(s.infer_shape(x=(5,))))
        out['sm_partial_1d_%s' % name] = _try(lambda: _shapes(s.infer_shape_partial(x=(5,))))
        s = fn(sym.var('x'), sym.var('l', shape=(0, 0)))
        out['sm_partial_3d_%s' % name] = _try(lambda: _shapes(s.infer_shape_partial(
            x=(5, 4, 3))))
    out['sm_wrong_length'] = _try(lambda: _shapes(sym.mxmp_softmax(
        sym.var('x'), sym.var('l'), use_length=True).infer_shape(x=(5, 3), l=(4,))))
    # LayerNorm: partial types and shapes, against MXNet's LayerNorm
    for name, fn in (('lib', sym.mxmp_layer_norm), ('mxnet', sym.LayerNorm)):
        s = fn(sym.var('x'), sym.var('g'), sym.var('b'))
        for key, kw in (('none', {}), ('gamma', {'g': 'float32'}), ('data', {'x': 'float64'})):
            res = _try(lambda: _types(s.infer_type_partial(**kw)))
            if 'ok' in res:
                res['ok'][1] = res['ok'][1][:1]   # MXNet's LayerNorm shows one output
            out['ln_type_%s_%s' % (key, name)] = res
        # a deferred Gluon parameter's shape: (0,) before the data is seen
        d = fn(sym.var('x'), sym.var('g', shape=(0,)), sym.var('b', shape=(0,)))
        for key, shape in (('1d', (7,)), ('3d', (2, 5, 7))):
            res = _try(lambda: _shapes(d.infer_shape(x=shape)))
            if 'ok' in res:
                res['ok'][1] = res['ok'][1][:1]
            out['ln_deferred_%s_%s' % (key, name)] = res
    s = sym.mxmp_layer_norm(sym.var('x'), sym.var('g', shape=(0,)), sym.var('b', shape=(0,)))
    out['ln_unknown_dim'] = _try(lambda: _shapes(s.infer_shape_partial(x=(2, 0))))
    out['ln_wrong_gamma'] = _try(lambda: _shapes(sym.mxmp_layer_norm(
        sym.var('x'), sym.var('g'), sym.var('b')).infer_shape(x=(2, 3), g=(4,), b=(3,))))
    out['dropout_type_partial'] = _try(lambda: _types(sym.mxmp_dropout(
        sym.var('x'), sym.var('f'), p=0.1).infer_type_partial()))
    # a 1-D LayerNorm in a converted Gluon block whose gamma/beta are deferred
    from mxnet import gluon
    import mxmp
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.LayerNorm())
    net.initialize()
    mxmp.convert(net, 'bfloat16')
    net.hybridize()
    x = mx.nd.array([1.0, 2.0, 4.0, 8.0])
    out['gluon_1d'] = net(x).asnumpy().tolist()
    out['gluon_1d_ops'] = [r.op for r in mxmp.explain(mxmp.converted_graph(net), 'bfloat16')]
    out['gluon_1d_mxnet'] = mx.nd.LayerNorm(x, mx.nd.ones(4), mx.nd.zeros(4)).asnumpy().tolist()
    out['messages'] = messages()
    return out


def messages():
    """Errors of bad dtypes and attributes (each as MXNet raises it)."""
    out = {}
    half = mx.nd.ones((2, 3), dtype='float16')
    out['ln_float16'] = _try(lambda: mx.nd.mxmp_layer_norm(half, mx.nd.ones(3, dtype='float16'),
                                                           mx.nd.ones(3, dtype='float16'))[0]
                             .asnumpy().tolist())
    out['dropout_int32'] = _try(lambda: mx.nd.mxmp_dropout(mx.nd.ones(4, dtype='int32'),
                                                           mx.nd.zeros(1), p=0.5)[0]
                                .asnumpy().tolist())
    out['softmax_float16'] = _try(lambda: mx.nd.mxmp_softmax(half).asnumpy().tolist())
    out['dropout_bad_p'] = _try(lambda: mx.nd.mxmp_dropout(mx.nd.ones(4), mx.nd.zeros(1),
                                                           p='abc')[0].asnumpy().tolist())
    out['ln_bad_eps'] = _try(lambda: mx.nd.mxmp_layer_norm(mx.nd.ones((2, 3)), mx.nd.ones(3),
                                                           mx.nd.ones(3), eps='1e-5x')[0]
                             .asnumpy().tolist())
    out['dropout_p_one'] = _try(lambda: mx.nd.mxmp_dropout(mx.nd.ones(4), mx.nd.zeros(1),
                                                           p=1.0)[0].asnumpy().tolist())
    return out


def outputs():
    """sha256 of every output and gradient of the three ops at BERT-like shapes (the parallel
    loops must give the same bits at any thread count)."""
    rng = np.random.RandomState(0)
    digest = {}

    def run(name, fn, arrays, grads, head):
        for a in grads:
            a.attach_grad()
        mx.random.seed(7)
        with autograd.record():
            y = fn(*arrays)
        y.backward(mx.nd.amp_cast(mx.nd.array(head), dtype=y.dtype))
        h = hashlib.sha256(y.asnumpy().tobytes())
        for a in grads:
            h.update(a.grad.asnumpy().tobytes())
        digest[name] = h.hexdigest()

    x = mx.nd.array(rng.normal(size=(4096, 96)) + 5)
    g, b = mx.nd.array(rng.uniform(0.5, 2, 96)), mx.nd.array(rng.normal(size=96))
    run('layer_norm', lambda x, g, b: mx.nd.mxmp_layer_norm(x, g, b)[0], [x, g, b], [x, g, b],
        rng.normal(size=(4096, 96)))
    s = mx.nd.array(rng.normal(size=(64, 32, 32)))
    run('softmax', lambda s, l: mx.nd.mxmp_softmax(s, l, use_length=True),
        [s, mx.nd.array(rng.randint(0, 33, size=(64, 32)), dtype='int32')], [s],
        rng.normal(size=(64, 32, 32)))
    d = mx.nd.array(rng.normal(size=(512, 1024)))
    run('dropout', lambda d: mx.nd.mxmp_dropout(d, mx.nd.zeros(1), p=0.1, mode='always')[0],
        [d], [d], rng.normal(size=(512, 1024)))
    # bfloat16 data (LayerNorm's gamma and beta float32)
    from mxnet.contrib.amp.amp import bfloat16
    xb, sb, db = (mx.nd.amp_cast(a, dtype=bfloat16) for a in (x, s, d))
    run('layer_norm_bf16', lambda x, g, b: mx.nd.mxmp_layer_norm(x, g, b)[0], [xb, g, b],
        [xb, g, b], rng.normal(size=(4096, 96)))
    run('softmax_bf16', lambda s, l: mx.nd.mxmp_softmax(s, l, use_length=True),
        [sb, mx.nd.array(rng.randint(0, 33, size=(64, 32)), dtype='int32')], [sb],
        rng.normal(size=(64, 32, 32)))
    run('dropout_bf16',
        lambda d: mx.nd.mxmp_dropout(d, mx.nd.zeros(1), p=0.1, mode='always')[0], [db], [db],
        rng.normal(size=(512, 1024)))
    return digest


if __name__ == '__main__':
    if load_library() is None:
        print(json.dumps({'library': None}))
        sys.exit(0)
    print(json.dumps({'contract': contract, 'inference': inference,
                      'outputs': outputs}[sys.argv[1]]()))
