"""Routes to bfloat16 for GluonNLP's attention matmuls under MXNet 1.9.1, measured.

    OMP_NUM_THREADS=1 python -m benchmarks.attention_routes [--seq-len 128] [--batch-size 8] \
        [--heads 12] [--head-dim 64] [--iters 8] [--profile] [--ops]

MXNet 1.9.1's ``_contrib_interleaved_matmul_selfatt_qk/valatt`` and ``_encdec_qk/valatt``
accept float32 only on CPU ("Only FP32 is supported on CPU"), so mxmp runs them in float32 with
casts around where mxmp's library ops cannot run. This script checks the routes a graph rule
can take, on one self-attention block (qk, softmax, valatt; forward and backward) at BERT-base shapes:

1. **bfloat16 batched products.** Which of MXNet's batched matrix products run in bfloat16 on
   CPU (:func:`bfloat16_batched_products`): ``batch_dot``, ``dot``, ``linalg.gemm2``,
   ``np.matmul`` and ``np.einsum``. None does in 1.9.1 (``batch_dot``/``dot``: "dot only
   supports float32/float64 for CPU"; ``np.einsum``: "Unknown type enum 12").
2. **float32 batch_dot** (:func:`selfatt_qk`, :func:`selfatt_valatt`, :func:`encdec_qk`,
   :func:`encdec_valatt`): the interleaved ops' function as
   ``Reshape``/``transpose``/``batch_dot`` in float32. It equals MXNet's op (bit for bit at
   head dim 64, whose scale 1/8 is exact) and serves as the executable statement of the ops'
   semantics; it is slower than the interleaved ops (their transposes are extra passes).
3. **bfloat16 grouped Convolution** (:func:`conv_attention`): the only batched bfloat16 GEMM of
   MXNet 1.9.1's CPU build is oneDNN's grouped Convolution: one group per (sequence, head),
   ``kernel=(1,)``, a computed weight. The layout changes stay in bfloat16 through ``SwapAxis``
   and ``split`` (never ``transpose``, whose bfloat16 kernel corrupts the heap). Its products
   run ~2.5x faster than the float32 interleaved ops, but the layout ops it needs cost more than
   that saves.
4. **mxmp's library ops in bfloat16** (:func:`library_attention`): ``mxmp_selfatt_qk`` and
   ``mxmp_selfatt_valatt`` of mxmp's operator library (AVX512-BF16 GEMM, float32 accumulation,
   bfloat16 in and out), what the kernel rule runs on the ``avx512_bf16`` tier.

Prints one JSON line per route: median and minimum milliseconds of the block's forward +
backward, the relative max-norm error of its output and input gradient against the interleaved
float32 ops (bfloat16 routes: bfloat16 inputs; the reference sees the same rounded values), and
with ``--profile`` the per-operator milliseconds from ``mx.profiler``. With ``--ops``, each of
the four ops alone instead (:func:`op_times`). docs/benchmark.md
("The attention matmuls") has the figures.
"""
import argparse
import json
import time

import numpy as np

__all__ = ['selfatt_qk', 'selfatt_valatt', 'encdec_qk', 'encdec_valatt', 'conv_attention',
           'interleaved_attention', 'batched_attention', 'bfloat16_batched_products',
           'time_block']


def _heads_first(x, parts, heads):
    """NDArray (seq, batch, heads * parts * d) -> (parts, batch * heads, seq, d): a transpose,
    in x's dtype (float32 here)."""
    seq, batch, width = x.shape
    d = width // (heads * parts)
    return x.reshape((seq, batch * heads, parts, d)).transpose((2, 1, 0, 3))


def _seq_first(out, heads):
    """NDArray (batch * heads, seq, d) -> (seq, batch, heads * d): a transpose."""
    bh, seq, d = out.shape
    return out.reshape((bh // heads, heads, seq, d)).transpose((2, 0, 1, 3)).reshape(
        (seq, bh // heads, heads * d))


def _scale(head_dim):
    """MXNet's scale of the query-key product: float32 1 / sqrt(head_dim)."""
    return float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))


def selfatt_qk(qkv, heads):
    """``_contrib_interleaved_matmul_selfatt_qk(qkv, heads)`` in float32 ops.

    Args:
        qkv (NDArray): (seq, batch, 3 * heads * d) float32; per sequence position and head the
            last axis holds that head's query, key and value (d values each), heads in order.
        heads (int): attention heads.

    Returns:
        NDArray: (batch * heads, seq, seq), entry (b * heads + h, i, j) = q_i . k_j / sqrt(d).
    """
    import mxnet as mx
    t = _heads_first(qkv, 3, heads)
    return mx.nd.batch_dot(t[0], t[1], transpose_b=True) * _scale(t.shape[3])


def selfatt_valatt(qkv, att, heads):
    """``_contrib_interleaved_matmul_selfatt_valatt(qkv, att, heads)`` in float32 ops: ``att``
    (batch * heads, seq, seq) times each head's values -> (seq, batch, heads * d), entry
    (i, b, h * d + e) = sum_j att[b * heads + h, i, j] v_j[e]."""
    import mxnet as mx
    return _seq_first(mx.nd.batch_dot(att, _heads_first(qkv, 3, heads)[2]), heads)


def encdec_qk(q, kv, heads):
    """``_contrib_interleaved_matmul_encdec_qk(q, kv, heads)`` in float32 ops: ``q`` (seq_q,
    batch, heads * d), ``kv`` (seq_k, batch, 2 * heads * d; per head its keys then its values)
    -> (batch * heads, seq_q, seq_k), q_i . k_j / sqrt(d)."""
    import mxnet as mx
    qh, k = _heads_first(q, 1, heads)[0], _heads_first(kv, 2, heads)[0]
    return mx.nd.batch_dot(qh, k, transpose_b=True) * _scale(qh.shape[2])


def encdec_valatt(kv, att, heads):
    """``_contrib_interleaved_matmul_encdec_valatt(kv, att, heads)`` in float32 ops: ``att``
    (batch * heads, seq_q, seq_k) times each head's values -> (seq_q, batch, heads * d)."""
    import mxnet as mx
    return _seq_first(mx.nd.batch_dot(att, _heads_first(kv, 2, heads)[1]), heads)


def conv_attention(qkv, heads):
    """One self-attention block (qk, softmax, valatt) on bfloat16 ``qkv`` (seq, batch,
    3 * heads * d) with both products as oneDNN grouped Convolutions in bfloat16 and the layout
    changes as bfloat16 ``SwapAxis``/``split``/``Reshape`` (no ``transpose``); the scale and the
    softmax in float32, as mxmp runs them. Returns (seq, batch, heads * d) bfloat16."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    nd = mx.nd
    seq, batch, width = qkv.shape
    d, g = width // (3 * heads), batch * heads
    t = nd.SwapAxis(qkv.reshape((seq, g, 3, d)), 0, 1)                  # (g, seq, 3, d)
    q, k, v = nd.split(t, axis=2, num_outputs=3, squeeze_axis=True)    # (g, seq, d) each
    # out[0, n * seq + i, j] = sum_e q[n, i, e] k[n, j, e]: data k^T, weight q
    att = nd.Convolution(nd.SwapAxis(k, 1, 2).reshape((1, g * d, seq)),
                         q.reshape((g * seq, d, 1)), kernel=(1,), num_filter=g * seq,
                         num_group=g, no_bias=True)
    att = nd.amp_cast(att, dtype='float32').reshape((g, seq, seq)) * _scale(d)
    p = nd.amp_cast(nd.softmax(att), dtype=bfloat16)
    # out[0, n * seq + i, e] = sum_j p[n, i, j] v[n, j, e]: data v, weight p
    out = nd.Convolution(v.reshape((1, g * seq, d)), p.reshape((g * seq, seq, 1)), kernel=(1,),
                         num_filter=g * seq, num_group=g, no_bias=True)
    out = nd.SwapAxis(nd.SwapAxis(out.reshape((batch, heads, seq, d)), 1, 2), 0, 1)
    return out.reshape((seq, batch, heads * d))


def interleaved_attention(qkv, heads, cast):
    """The block on MXNet's interleaved ops in float32; ``cast``: ``qkv`` is bfloat16, cast to
    float32 and the output back (what mxmp's bfloat16 graph runs)."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    nd = mx.nd
    x = nd.amp_cast(qkv, dtype='float32') if cast else qkv
    att = nd.contrib.interleaved_matmul_selfatt_qk(x, heads=heads)
    out = nd.contrib.interleaved_matmul_selfatt_valatt(x, nd.softmax(att), heads=heads)
    return nd.amp_cast(out, dtype=bfloat16) if cast else out


def library_attention(qkv, heads):
    """The block as mxmp's bfloat16 graph runs it on the ``avx512_bf16`` tier (route 4): mxmp's
    library ops ``mxmp_selfatt_qk``/``_valatt`` in bfloat16 (float32 accumulation), the
    softmax in float32 between casts. ``qkv`` bfloat16; returns bfloat16."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    nd = mx.nd
    att = nd.amp_cast(nd.mxmp_selfatt_qk(qkv, heads=heads), dtype='float32')
    probs = nd.amp_cast(nd.softmax(att), dtype=bfloat16)
    return nd.mxmp_selfatt_valatt(qkv, probs, heads=heads)


def batched_attention(qkv, heads):
    """The block on float32 ``transpose``/``batch_dot`` (route 2)."""
    import mxnet as mx
    return selfatt_valatt(qkv, mx.nd.softmax(selfatt_qk(qkv, heads)), heads)


def bfloat16_batched_products():
    """{op: 'ok' or the last line of MXNet's error}: whether each batched matrix product of
    MXNet runs on bfloat16 (96, 128, 64) x (96, 64, 128) arrays on this CPU."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    nd = mx.nd
    a = nd.amp_cast(nd.ones((96, 128, 64)), dtype=bfloat16)
    b = nd.amp_cast(nd.ones((96, 64, 128)), dtype=bfloat16)
    tries = {'batch_dot': lambda: nd.batch_dot(a, b),
             'dot': lambda: nd.dot(a[0], b[0]),
             'linalg.gemm2': lambda: nd.linalg.gemm2(a, b),
             'np.matmul': lambda: mx.np.matmul(a.as_np_ndarray(), b.as_np_ndarray()),
             'np.einsum': lambda: mx.np.einsum('bij,bjk->bik', a.as_np_ndarray(),
                                               b.as_np_ndarray())}
    out = {}
    for name, run in tries.items():
        try:
            run().wait_to_read()
            out[name] = 'ok'
        except mx.base.MXNetError as err:
            out[name] = [line for line in str(err).splitlines() if line.strip()][-1].strip()
    return out


def time_block(block, qkv, out_grad, iters):
    """Output, input gradient and per-iteration seconds of ``block(qkv)`` forward + backward."""
    import mxnet as mx
    qkv.attach_grad()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        with mx.autograd.record():
            out = block(qkv)
        out.backward(out_grad)
        qkv.grad.wait_to_read()
        times.append(time.perf_counter() - start)
    as32 = lambda x: mx.nd.amp_cast(x, dtype='float32').asnumpy()   # noqa: E731
    return as32(out), as32(qkv.grad), times


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def _profile(block, qkv, out_grad, iters):
    import mxnet as mx
    mx.profiler.set_config(profile_imperative=True, aggregate_stats=True,
                           filename='/dev/null')
    mx.profiler.set_state('run')
    time_block(block, qkv, out_grad, iters)
    mx.profiler.set_state('stop')
    stats = json.loads(mx.profiler.dumps(format='json', reset=True))['Time']
    ops = {op: round(s['Total'] / iters, 2) for domain in stats.values()
           for op, s in domain.items() if not op.startswith(('MX', 'DeleteVariable'))}
    return dict(sorted(ops.items(), key=lambda kv: -kv[1]))


def op_times(seq, batch, heads, head_dim, iters):
    """{op: {'mxnet_float32': [ms...], 'library_bfloat16': [ms...]}}: forward + backward of each
    interleaved op alone at these shapes (encdec: seq_q = seq_k = ``seq``), MXNet's float32 op
    on float32 arrays against the library op on bfloat16 ones, rounds interleaved."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    nd = mx.nd
    rng = np.random.RandomState(0)
    g, w = batch * heads, heads * head_dim
    shapes = {'selfatt_qk': [(seq, batch, 3 * w)],
              'selfatt_valatt': [(seq, batch, 3 * w), (g, seq, seq)],
              'encdec_qk': [(seq, batch, w), (seq, batch, 2 * w)],
              'encdec_valatt': [(seq, batch, 2 * w), (g, seq, seq)]}
    out = {}
    for op, ins in shapes.items():
        arrays = [nd.array(rng.uniform(size=s)) for s in ins]
        fns = {'mxnet_float32': (getattr(nd.contrib, 'interleaved_matmul_' + op), 'float32'),
               'library_bfloat16': (getattr(nd, 'mxmp_' + op), bfloat16)}
        runs = {}
        for name, (fn, dtype) in fns.items():
            xs = [nd.amp_cast(a, dtype=dtype) for a in arrays]
            for x in xs:
                x.attach_grad()
            head = nd.amp_cast(nd.ones(fn(*xs, heads=heads).shape), dtype=dtype)

            def run(fn=fn, xs=xs, head=head):
                start = time.perf_counter()
                with mx.autograd.record():
                    y = fn(*xs, heads=heads)
                y.backward(head)
                for x in xs:
                    x.grad.wait_to_read()
                return 1e3 * (time.perf_counter() - start)
            run()
            runs[name] = run
        out[op] = {name: [] for name in runs}
        for _ in range(iters):
            for name, run in runs.items():
                out[op][name].append(run())
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--seq-len', type=int, default=128)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--heads', type=int, default=12)
    p.add_argument('--head-dim', type=int, default=64)
    p.add_argument('--iters', type=int, default=8,
                   help='timed rounds, each route once per round (after 2 untimed)')
    p.add_argument('--profile', action='store_true', help="per-operator ms from mx.profiler")
    p.add_argument('--ops', action='store_true', help='each op alone, forward + backward: '
                   "MXNet's float32 op against mxmp's library op in bfloat16 (op_times)")
    args = p.parse_args(argv)
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    if args.ops:
        from mxmp._src.kernels.build import load_library
        if load_library() is None:
            raise SystemExit("mxmp's operator library does not load here")
        for op, runs in op_times(args.seq_len, args.batch_size, args.heads, args.head_dim,
                                 args.iters).items():
            print(json.dumps({'op': op, **{name: {'ms_median': round(float(np.median(t)), 2),
                                                  'ms_min': round(min(t), 2)}
                                           for name, t in runs.items()}}), flush=True)
        return
    print(json.dumps({'bfloat16_batched_products': bfloat16_batched_products()}))
    s, b, h = args.seq_len, args.batch_size, args.heads
    rng = np.random.RandomState(0)
    x32 = mx.nd.array(rng.normal(size=(s, b, 3 * h * args.head_dim)))
    g32 = mx.nd.array(rng.normal(size=(s, b, h * args.head_dim)))
    # every route sees the same bfloat16-representable values
    x32 = mx.nd.amp_cast(mx.nd.amp_cast(x32, dtype=bfloat16), dtype='float32')
    g32 = mx.nd.amp_cast(mx.nd.amp_cast(g32, dtype=bfloat16), dtype='float32')
    x16, g16 = mx.nd.amp_cast(x32, dtype=bfloat16), mx.nd.amp_cast(g32, dtype=bfloat16)
    routes = {
        'interleaved_float32': (lambda x: interleaved_attention(x, h, False), x32, g32),
        'interleaved_float32_cast': (lambda x: interleaved_attention(x, h, True), x16, g16),
        'batch_dot_float32': (lambda x: batched_attention(x, h), x32, g32),
        'conv_bfloat16': (lambda x: conv_attention(x, h), x16, g16),
    }
    from mxmp._src.kernels.build import load_library
    if load_library() is not None:
        routes['library_bfloat16'] = (lambda x: library_attention(x, h), x16, g16)
    # rounds interleave the routes (A B C D A B C D ...): a shared machine's load hits all alike
    results = {name: time_block(block, x.copy(), g, 2) for name, (block, x, g) in routes.items()}
    times = {name: [] for name in routes}
    for _ in range(args.iters):
        for name, (block, x, g) in routes.items():
            out, grad, once = time_block(block, x.copy(), g, 1)
            results[name] = (out, grad)
            times[name] += once
    ref = results['interleaved_float32']
    for name, (block, x, g) in routes.items():
        out, grad = results[name][:2]
        row = {'route': name, 'ms_median': round(1e3 * float(np.median(times[name])), 2),
               'ms_min': round(1e3 * min(times[name]), 2), 'output_rel_err': _rel(out, ref[0]),
               'input_grad_rel_err': _rel(grad, ref[1])}
        if args.profile:
            row['profile_ms'] = _profile(block, x.copy(), g, args.iters)
        print(json.dumps(row), flush=True)

if __name__ == '__main__':
    main()
