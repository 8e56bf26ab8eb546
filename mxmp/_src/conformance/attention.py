"""The conformance suite's ``library`` case of the attention matmuls mxmp's operator library
replaces (``_contrib_interleaved_matmul_selfatt_qk/valatt``, ``_encdec_qk/valatt``, and
``batch_dot`` under ``Policy(kernels='all')``; the kernel
rule's :data:`~mxmp._src.graph.kernel_rule.ATTENTION`): the library op against a float64
reference of the op's definition (:func:`reference`), in float32 and in bfloat16, on
bfloat16-representable inputs, so that the reference multiplies the values the kernel does.
Runs in the suite's child process (:mod:`.run`), on whichever path the library takes there
(AVX512-BF16, or portable under a ``DNNL_MAX_CPU_ISA`` cap), whether or not the rule would
substitute the op on this tier.
"""
import numpy as np

from .arrays import _op_fn, _rel_err, _to_np, _values

__all__ = ['round_bf16', 'reference', 'FLOAT32_TOL', 'BFLOAT16_TOL', 'attention_row']

#: float32 in and out: float32 sums of exact products (measured: below 4e-7).
FLOAT32_TOL = 2.0 ** -16
#: bfloat16 in and out: the output's rounding to nearest even (2**-8 of a value at most).
BFLOAT16_TOL = 2.0 ** -8 + FLOAT32_TOL


def round_bf16(a):
    """``a`` (array) rounded to bfloat16, nearest even, as float32 (finite values)."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def _heads_first(x, parts, heads):
    """(seq, batch, heads * parts * d) -> (parts, batch * heads, seq, d)."""
    seq, batch, width = x.shape
    return x.reshape(seq, batch * heads, parts, width // (heads * parts)).transpose(2, 1, 0, 3)


def _interleave(parts, shape):
    """Stack ``parts`` (each (batch * heads, seq, d)) into a (seq, batch, heads * P * d)
    tensor of ``shape``."""
    return np.stack(parts).transpose(2, 1, 0, 3).reshape(shape)


def reference(op, xs, og, heads):
    """The output and input gradients (list of float64 arrays) of the interleaved op ``op``
    (MXNet's name, or its short name ``selfatt_qk``...) on inputs ``xs`` with output gradient
    ``og``, from the definition (``batch_dot``: ``heads`` is its ``(transpose_a,
    transpose_b)``): qk is q_i . k_j / sqrt(d) per (batch, head), d the head
    dimension (the scale is float32 1/sqrt(d) in MXNet); valatt is sum_j att[i, j] v_j; the
    parts of an interleaved input an op does not read get a zero gradient."""
    op = op.replace('_contrib_interleaved_matmul_', '')
    xs = [np.asarray(x, np.float64) for x in xs]
    og = np.asarray(og, np.float64)
    if op == 'batch_dot':   # heads: (transpose_a, transpose_b)
        ta, tb = heads
        a = np.swapaxes(xs[0], -1, -2) if ta else xs[0]
        b = np.swapaxes(xs[1], -1, -2) if tb else xs[1]
        da = og @ np.swapaxes(b, -1, -2)
        db = np.swapaxes(a, -1, -2) @ og
        return [a @ b, np.swapaxes(da, -1, -2) if ta else da,
                np.swapaxes(db, -1, -2) if tb else db]
    if op in ('selfatt_qk', 'encdec_qk'):
        if op == 'selfatt_qk':
            q, k = _heads_first(xs[0], 3, heads)[:2]
        else:
            q, k = _heads_first(xs[0], 1, heads)[0], _heads_first(xs[1], 2, heads)[0]
        s = 1.0 / np.sqrt(np.float64(q.shape[2]))
        out = np.einsum('gid,gjd->gij', q, k) * s
        dq = np.einsum('gij,gjd->gid', og, k) * s
        dk = np.einsum('gij,gid->gjd', og, q) * s
        if op == 'selfatt_qk':
            return [out, _interleave([dq, dk, np.zeros_like(dq)], xs[0].shape)]
        return [out, _interleave([dq], xs[0].shape), _interleave([dk, np.zeros_like(dk)],
                                                                   xs[1].shape)]
    parts = 3 if op == 'selfatt_valatt' else 2
    v, att = _heads_first(xs[0], parts, heads)[parts - 1], xs[1]
    d = v.shape[2]
    out = np.einsum('gij,gjd->gid', att, v)
    ogh = og.reshape(og.shape[0], -1, d).transpose(1, 0, 2)   # (batch * heads, seq_q, d)
    dv = np.einsum('gij,gid->gjd', att, ogh)
    return [out.transpose(1, 0, 2).reshape(og.shape),
            _interleave([np.zeros_like(dv)] * (parts - 1) + [dv], xs[0].shape),
            np.einsum('gid,gjd->gij', ogh, v)]


def _run(sym, values, names, heads, dtype):
    """Forward (training) and backward of ``sym`` bound on ``values`` cast to ``dtype``, with
    the head gradients ``heads`` (one per output): its outputs, then the inputs' gradients."""
    import mxnet as mx
    args = {n: mx.nd.amp_cast(mx.nd.array(values[n]), dtype=dtype) for n in names}
    exe = sym.bind(mx.cpu(), args=args, args_grad={n: a.zeros_like() for n, a in args.items()})
    outs = exe.forward(is_train=True)
    exe.backward([mx.nd.amp_cast(mx.nd.array(h), dtype=dtype) for h in heads])
    arrays = list(outs) + [exe.grad_dict[n] for n in names]
    return [_to_np(a) for a in arrays], {str(np.dtype(a.dtype).names or a.dtype) for a in arrays}


#: The variant (label prefix) of ``selfatt_valatt``'s cases that runs the self-attention pair:
#: ``selfatt_qk`` and ``selfatt_valatt`` reading one qkv, which the kernel rule runs as
#: ``mxmp_selfatt_qk(emit_v=1)`` and ``mxmp_selfatt_valatt(v_only=1)`` (kernel_rule.selfatt_pairs).
PAIR_VARIANT = 'pair'


def _pair_reference(xs, ogs, heads):
    """Outputs (scores, context) and gradients (qkv: the sum of both ops', att) of the pair."""
    qk = reference('selfatt_qk', xs[:1], ogs[0], heads)
    va = reference('selfatt_valatt', xs, ogs[1], heads)
    return [qk[0], va[0], qk[1] + va[1], va[2]]


def attention_row(row, inputs, attrs, seeds):
    """The ``library`` case of an attention matmul (module docstring): the rule's graph of the
    op with the attention substitution on, float32 and bfloat16, against :func:`reference`;
    MXNet's float32 op on the same values is measured beside it. A ``selfatt_valatt`` variant
    whose name starts with :data:`PAIR_VARIANT` runs the self-attention pair (both ops on one
    qkv: the library's ``emit_v``/``v_only`` ops), outputs and gradients against the two
    references."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    from ..graph.kernel_rule import apply_kernels
    from ..graph.selfatt_pair import EMIT_V, V_ONLY
    from ..graph.symbol_json import dump, load
    op = row['op']
    names = ['in%d' % i for i in range(len(inputs))]
    pair = (op == '_contrib_interleaved_matmul_selfatt_valatt' and
            str(row.get('variant', '')).startswith(PAIR_VARIANT))
    args = [mx.sym.var(n) for n in names]
    sym = _op_fn(op)(*args, name='op', **attrs)
    if pair:   # qk first: the graph's order the rule pairs
        sym = mx.sym.Group([_op_fn('_contrib_interleaved_matmul_selfatt_qk')(
            args[0], name='qk', **attrs), sym])
    graph = apply_kernels(load(sym), 'all', attention=True)   # batch_dot: opt-in
    if not any(n['op'].startswith('mxmp_') for n in graph['nodes']):
        row.update(mode='real', detail="mxmp's operator library is not available here (no "
                                       "compiler?): MXNet's kernel runs")
        return row
    paired = {k for n in graph['nodes'] for k in (EMIT_V, V_ONLY)
              if n.get('attrs', {}).get(k) == '1'}
    lib = dump(graph)
    errs = {'float32': 0.0, 'bfloat16': 0.0, 'mxnet': 0.0}
    dtypes_ok = True
    for seed in seeds:
        rng = np.random.RandomState(seed)
        values = {n: round_bf16(_values(rng, shape, kind)) for n, (shape, kind) in
                  zip(names, inputs)}
        out_shapes = sym.infer_shape(**{n: v.shape for n, v in values.items()})[1]
        heads = [round_bf16(rng.normal(size=s)) for s in out_shapes]
        xs = [values[n] for n in names]
        if pair:
            ref = _pair_reference(xs, heads, int(attrs['heads']))
        else:
            ref = reference(op, xs, heads[0], int(attrs['heads']) if 'heads' in attrs else
                            (attrs.get('transpose_a', False), attrs.get('transpose_b', False)))
        for key, graph_sym, dtype in (('float32', lib, 'float32'), ('bfloat16', lib, bfloat16),
                                      ('mxnet', sym, 'float32')):
            got, seen = _run(graph_sym, values, names, heads, dtype)
            dtypes_ok &= len(seen) == 1
            errs[key] = max([errs[key]] + [_rel_err(g, r) for g, r in zip(got, ref)])
    bad = [w for w, e, t in (('float32', errs['float32'], FLOAT32_TOL),
                             ('bfloat16', errs['bfloat16'], BFLOAT16_TOL)) if not e <= t]
    if not dtypes_ok:
        bad.append('outputs and gradients not all in the inputs\' dtype')
    if pair and paired != {EMIT_V, V_ONLY}:
        bad.append('the kernel rule did not make the pair (emit_v, v_only)')
    row.update(mode='real', fwd_err=errs['bfloat16'], bwd_err=errs['float32'],
               verdict='wrong' if bad else 'ok',
               detail=("the self-attention pair (selfatt_qk emit_v=1, selfatt_valatt v_only=1 "
                       'on one qkv): ' if pair else '') +
                      "mxmp's library kernel (bfloat16 products, float32 sums) against float64 "
                      'on bfloat16-representable inputs: bfloat16 in and out %.1e (tolerance '
                      '2**-8), float32 in and out %.1e (2**-16; MXNet\'s float32 op %.1e), '
                      'forward and backward' % (errs['bfloat16'], errs['float32'],
                                                errs['mxnet']) +
                      ('; %s' % ', '.join(bad) if bad else ''))
    return row
