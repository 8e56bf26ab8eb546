#!/usr/bin/env python3
"""Worker of tests/kernels/test_ln_copy.py: runs mxmp's library LayerNorm with ``copy_out=1``
(the kernel rule's LayerNorm copy: a fourth output, a copy of out, whose backward sums the two
gradients of out) against the same op without it fed MXNet's ``add_n`` of the two gradients
(the rule's graph without the copy), in its own process (the library reads
``DNNL_MAX_CPU_ISA`` once), and prints one JSON line: per shape, dtype and input kind, whether
out, the copy, dx, dgamma and dbeta are the same bits, and the outputs' dtypes.

    python tests/kernels/ln_copy_worker.py
"""
import json
import os
import sys

import numpy as np

import mxnet as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from mxmp._src.kernels.build import load_library  # noqa: E402

#: (rows..., D): BERT's hidden size, odd sizes (a row shorter than a vector, one row).
SHAPES = [(4, 64, 768), (3, 5, 7), (1, 33)]


def _np(a):
    """float32 (float64 for float64) numpy copy of ``a``."""
    return (a if a.dtype == np.float64 else mx.nd.amp_cast(a, dtype='float32')).asnumpy()


def _bits(a):
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32)


def _compare(got, want):
    """``{'bits': identical bits, 'nan': NaN where NaN}``."""
    return {'bits': bool(np.array_equal(_bits(got), _bits(want))),
            'nan': bool(np.array_equal(np.isnan(got), np.isnan(want)))}


def _inputs(shape, kind, rng):
    x = rng.normal(size=shape) * 3 + 1
    g = rng.normal(size=shape[-1:])
    b = rng.normal(size=shape[-1:])
    h0 = rng.normal(size=shape)
    h1 = rng.normal(size=shape) * 1e-3   # sums whose rounding matters
    if kind == 'nonfinite':   # NaN and inf in the data of one row, in each gradient
        x.reshape(-1, shape[-1])[0, 0] = np.nan
        h0.reshape(-1, shape[-1])[-1, -1] = np.inf
        h1.reshape(-1, shape[-1])[-1, 0] = np.nan
        h1.reshape(-1, shape[-1])[0, -1] = -np.inf
        h0.reshape(-1, shape[-1])[0, 1] = -0.0
        h1.reshape(-1, shape[-1])[0, 1] = -0.0
    return x, g, b, h0, h1


def _run(copy, arrays, dtype):
    base = 'float64' if dtype == 'float64' else 'float32'
    x, g, b, h0, h1 = [mx.nd.array(a, dtype=base) for a in arrays]
    if dtype not in ('float32', 'float64'):
        x, h0, h1 = [mx.nd.amp_cast(a, dtype=dtype) for a in (x, h0, h1)]
    for a in (x, g, b):
        a.attach_grad()
    with mx.autograd.record():
        if copy:
            y, _, _, c = mx.nd.mxmp_layer_norm(x, g, b, copy_out=1)
        else:
            y, _, _ = mx.nd.mxmp_layer_norm(x, g, b)
    if copy:
        mx.autograd.backward([y, c], [h0, h1])
    else:
        y.backward(mx.nd.add_n(h0, h1))   # what MXNet sums without the copy
    out = {'y': y, 'dx': x.grad, 'dgamma': g.grad, 'dbeta': b.grad}
    if copy:
        out['copy'] = c
    dtypes = [str(np.dtype(t.dtype).names[0] if np.dtype(t.dtype).names else
                  np.dtype(t.dtype).name) for t in (out['y'], out.get('copy', out['y']))]
    return {k: _np(t) for k, t in out.items()}, dtypes


def main():
    from mxnet.contrib.amp.amp import bfloat16
    assert load_library() is not None
    rows = []
    for shape in SHAPES:
        for kind in ('normal', 'nonfinite'):
            arrays = _inputs(shape, kind, np.random.RandomState(shape[-1]))
            for name, dtype in (('float32', 'float32'), ('bfloat16', bfloat16),
                                ('float64', 'float64')):
                got, dtypes = _run(True, arrays, dtype)
                want, _ = _run(False, arrays, dtype)
                row = {'shape': shape, 'kind': kind, 'dtype': name, 'dtypes': dtypes,
                       'copy': _compare(got['copy'], want['y'])}
                row.update({k: _compare(got[k], want[k]) for k in want})
                rows.append(row)
    # the copy unread: its zero gradient adds nothing (the backward of out alone)
    x = mx.nd.array(np.random.RandomState(1).normal(size=(9, 2, 13)))
    g, b = mx.nd.ones((13,)), mx.nd.zeros((13,))
    grads = []
    for copy in (True, False):
        x.attach_grad()
        with mx.autograd.record():
            y = mx.nd.mxmp_layer_norm(x, g, b, copy_out=1)[0] if copy else \
                mx.nd.mxmp_layer_norm(x, g, b)[0]
        y.backward(mx.nd.array(np.random.RandomState(2).normal(size=(9, 2, 13))))
        grads.append(x.grad.asnumpy())
    print(json.dumps({'rows': rows, 'unread': _compare(*grads),
                      'isa': os.environ.get('DNNL_MAX_CPU_ISA', '')}))


if __name__ == '__main__':
    main()
