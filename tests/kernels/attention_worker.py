#!/usr/bin/env python3
"""Worker of tests/kernels/test_attention_kernel.py: runs mxmp's attention matmuls
(``mxmp_selfatt_qk/valatt``, ``mxmp_encdec_qk/valatt``) in their own process, so that the
``DNNL_MAX_CPU_ISA`` the library reads at its first call is this process's, and prints one JSON
line: per op, shape and dtype (float32, bfloat16 in and out), the output and input gradients'
relative max-norm errors against a float64 reference on the same bfloat16-representable
values, the dtypes of the arrays MXNet returns, MXNet's own float32 op's errors, and an md5 of
the library's output bits.

    python tests/kernels/attention_worker.py
"""
import hashlib
import json
import os
import sys

import numpy as np

import mxnet as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from mxmp._src.conformance.attention import reference, round_bf16  # noqa: E402
from mxmp._src.kernels.build import load_library  # noqa: E402

#: (seq_q, seq_k, batch, heads, head_dim): BERT's head dim 64 at a short sequence, and odd
#: sizes (edges of the 8 x 32 tiles, odd k, one head).
SHAPES = [(128, 128, 2, 2, 64), (33, 9, 2, 3, 17), (7, 40, 3, 1, 5)]
OPS = ('selfatt_qk', 'selfatt_valatt', 'encdec_qk', 'encdec_valatt')


def _inputs(op, shape, rng):
    lq, lk, batch, heads, d = shape
    if op == 'selfatt_qk':
        return [rng.normal(size=(lq, batch, 3 * heads * d))]
    if op == 'selfatt_valatt':
        return [rng.normal(size=(lq, batch, 3 * heads * d)),
                rng.uniform(size=(batch * heads, lq, lq))]
    if op == 'encdec_qk':
        return [rng.normal(size=(lq, batch, heads * d)),
                rng.normal(size=(lk, batch, 2 * heads * d))]
    return [rng.normal(size=(lk, batch, 2 * heads * d)),
            rng.uniform(size=(batch * heads, lq, lk))]


def _run(fn, xs, og, dtype):
    nd = mx.nd
    arrays = [nd.amp_cast(nd.array(x), dtype=dtype) for x in xs]
    for a in arrays:
        a.attach_grad()
    with mx.autograd.record():
        y = fn(*arrays)
    y.backward(nd.amp_cast(nd.array(og), dtype=dtype))
    outs = [y] + [a.grad for a in arrays]
    names = [np.dtype(a.dtype).names[0] if np.dtype(a.dtype).names else np.dtype(a.dtype).name
             for a in outs]
    return [nd.amp_cast(a, dtype='float32').asnumpy() for a in outs], names


def _err(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def main():
    from mxnet.contrib.amp.amp import bfloat16
    assert load_library() is not None
    rows = []
    for shape in SHAPES:
        heads = shape[3]
        for i, op in enumerate(OPS):
            rng = np.random.RandomState(i)
            xs = [round_bf16(x) for x in _inputs(op, shape, rng)]
            out_shape = getattr(mx.nd, 'mxmp_' + op)(*[mx.nd.array(x) for x in xs],
                                                     heads=heads).shape
            og = round_bf16(rng.normal(size=out_shape))
            ref = reference(op, xs, og, heads)
            lib = getattr(mx.nd, 'mxmp_' + op)
            mxnet_op = getattr(mx.nd.contrib, 'interleaved_matmul_' + op)
            row = {'op': op, 'shape': shape}
            for name, dtype in (('float32', 'float32'), ('bfloat16', bfloat16)):
                got, dtypes = _run(lambda *a: lib(*a, heads=heads), xs, og, dtype)
                row[name] = {'err': [_err(g, r) for g, r in zip(got, ref)], 'dtypes': dtypes,
                             'md5': hashlib.md5(b''.join(g.tobytes() for g in got)).hexdigest()}
            got, _ = _run(lambda *a: mxnet_op(*a, heads=heads), xs, og, 'float32')
            row['mxnet_float32_err'] = [_err(g, r) for g, r in zip(got, ref)]
            rows.append(row)
    # NaN and inf in one input row propagate to exactly the outputs that read it
    x = np.ones((4, 1, 6), np.float32)
    x[1, 0, 0] = np.nan
    y = mx.nd.mxmp_selfatt_qk(mx.nd.array(x), heads=1).asnumpy()
    nan_rows = sorted({int(i) for i in np.argwhere(np.isnan(y))[:, 1]})
    nan_cols = sorted({int(j) for j in np.argwhere(np.isnan(y))[:, 2]})
    print(json.dumps({'rows': rows, 'nan_rows': nan_rows, 'nan_cols': nan_cols,
                      'isa': os.environ.get('DNNL_MAX_CPU_ISA', '')}))


if __name__ == '__main__':
    main()
