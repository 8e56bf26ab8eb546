#!/usr/bin/env python3
"""Worker of tests/kernels/test_selfatt_pair.py: runs the self-attention pair of mxmp's library
(``mxmp_selfatt_qk`` with ``emit_v=1``, ``mxmp_selfatt_valatt`` with ``v_only=1``) against the
two ops reading the interleaved qkv (the kernel rule's graph without the pair), in its own
process (the library reads ``DNNL_MAX_CPU_ISA`` once), and prints one JSON line: per shape,
dtype and input kind, whether the outputs (scores, context, the emitted values) and the
gradients of qkv and att are the same numbers, and where their bits differ.

    python tests/kernels/selfatt_pair_worker.py
"""
import json
import os
import sys

import numpy as np

import mxnet as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
from mxmp._src.kernels.build import load_library  # noqa: E402

#: (seq, batch, heads, head_dim): BERT's head dim at a short sequence, odd sizes (tile edges,
#: odd k, one head).
SHAPES = [(128, 2, 2, 64), (33, 2, 3, 17), (7, 3, 1, 5)]


def _f32(a):
    return mx.nd.amp_cast(a, dtype='float32').asnumpy()


def _compare(got, want):
    """``{'equal': same numbers (NaN where NaN, +0 = -0), 'bits': identical bits, 'other':
    bits differ somewhere other than a zero against a zero or a NaN against a NaN}``."""
    equal = bool(np.array_equal(got, want, equal_nan=True))
    diff = got.view(np.uint32) != want.view(np.uint32)
    both_zero = (got == 0) & (want == 0)
    both_nan = np.isnan(got) & np.isnan(want)
    return {'equal': equal, 'bits': bool(not diff.any()),
            'other': bool((diff & ~both_zero & ~both_nan).any())}


def _inputs(shape, kind, rng):
    seq, batch, heads, d = shape
    qkv = rng.normal(size=(seq, batch, 3 * heads * d)).astype(np.float32)
    att = rng.uniform(size=(batch * heads, seq, seq)).astype(np.float32)
    hs = rng.normal(size=(batch * heads, seq, seq)).astype(np.float32)
    hc = rng.normal(size=(seq, batch, heads * d)).astype(np.float32)
    if kind == 'nonfinite':   # NaN and inf in a query, a key, a value, att and both heads
        qkv[1, 0, 0] = np.nan
        qkv[2, -1, d] = np.inf
        qkv[-1, 0, 3 * heads * d - 1] = -np.inf
        qkv[0, -1, 2 * d] = np.nan
        att[0, 1, -1] = np.inf
        hs[-1, 0, 0] = np.nan
        hc[0, 0, -1] = -np.inf
        qkv[3, 0, 1] = -0.0
    return qkv, att, hs, hc


def _run(pair, qkv, att, hs, hc, heads, dtype):
    arrays = [mx.nd.amp_cast(mx.nd.array(a), dtype=dtype) for a in (qkv, att, hs, hc)]
    x, a, hs, hc = arrays
    x.attach_grad()
    a.attach_grad()
    with mx.autograd.record():
        if pair:
            scores, v = mx.nd.mxmp_selfatt_qk(x, heads=heads, emit_v=1)
            ctx = mx.nd.mxmp_selfatt_valatt(v, a, heads=heads, v_only=1)
        else:
            scores = mx.nd.mxmp_selfatt_qk(x, heads=heads)
            ctx = mx.nd.mxmp_selfatt_valatt(x, a, heads=heads)
    mx.autograd.backward([scores, ctx], [hs, hc])
    out = {'scores': scores, 'ctx': ctx, 'dqkv': x.grad, 'datt': a.grad}
    dtypes = sorted({str(np.dtype(t.dtype).names[0] if np.dtype(t.dtype).names else
                         np.dtype(t.dtype).name) for t in out.values()})
    res = {k: _f32(t) for k, t in out.items()}
    if pair:
        res['v'] = _f32(v)
    return res, dtypes


def main():
    from mxnet.contrib.amp.amp import bfloat16
    assert load_library() is not None
    rows = []
    for shape in SHAPES:
        seq, batch, heads, d = shape
        for kind in ('normal', 'nonfinite'):
            qkv, att, hs, hc = _inputs(shape, kind, np.random.RandomState(seq))
            for name, dtype in (('float32', 'float32'), ('bfloat16', bfloat16)):
                got, got_dtypes = _run(True, qkv, att, hs, hc, heads, dtype)
                want, want_dtypes = _run(False, qkv, att, hs, hc, heads, dtype)
                x = _f32(mx.nd.amp_cast(mx.nd.array(qkv), dtype=dtype))
                v_ref = x.reshape(seq, batch, heads, 3, d)[:, :, :, 2].reshape(seq, batch, -1)
                row = {'shape': shape, 'kind': kind, 'dtype': name,
                       'dtypes': got_dtypes, 'want_dtypes': want_dtypes,
                       'v': _compare(got['v'], v_ref)}
                row.update({k: _compare(got[k], want[k]) for k in want})
                rows.append(row)
    # the values' output unread: the backward writes zeros in the values' part of dqkv, as the
    # qk without the pair does
    x = mx.nd.array(np.random.RandomState(1).normal(size=(9, 2, 3 * 2 * 5)))
    grads = []
    for pair in (True, False):
        x.attach_grad()
        with mx.autograd.record():
            scores = (mx.nd.mxmp_selfatt_qk(x, heads=2, emit_v=1)[0] if pair else
                      mx.nd.mxmp_selfatt_qk(x, heads=2))
        scores.backward(mx.nd.ones_like(scores))
        grads.append(x.grad.asnumpy())
    unread = _compare(*grads)
    unread['values_zero'] = bool((grads[0].reshape(9, 2, 2, 3, 5)[:, :, :, 2] == 0).all())
    print(json.dumps({'rows': rows, 'unread': unread,
                      'isa': os.environ.get('DNNL_MAX_CPU_ISA', '')}))


if __name__ == '__main__':
    main()
