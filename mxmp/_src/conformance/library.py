"""The conformance suite's ``library`` case: each op mxmp's operator library replaces (the
pass's kernel rule, :mod:`mxmp._src.graph.kernel_rule`), run as the rule's graph against MXNet's
own op (docs/conformance.md). Runs in the suite's child process (:mod:`.run`).
"""
import numpy as np

from ..policy.policy import Policy
from .arrays import _op_fn, _rel_err, _run, _values

#: Relative error bound of the ``library`` case (float32 against MXNet's float32 kernel):
#: 2**-16, about 128 float32 unit roundoffs (measured: below 2e-6, docs/conformance.md).
LIBRARY_TOL = 2.0 ** -16
#: The variant (label prefix) of LayerNorm's cases that runs the kernel rule's LayerNorm copy:
#: the output read by two ops, so the library op runs with ``copy_out=1`` (:mod:`..graph.ln_copy`).
COPY_VARIANT = 'copy'
#: Dropout: the dropped fraction may differ from p by this many binomial standard deviations.
SIGMAS = 5.0


def library_row(row, inputs, attrs, seeds):
    """The ``library`` case: the kernel rule's graph of the op (mxmp's library kernel) against
    MXNet's own op, both float32, forward (training mode) and backward, on the same inputs."""
    import mxnet as mx
    from ..graph.kernel_rule import ATTENTION, substitute
    from ..graph.symbol_json import dump, load
    op = row['op']
    if op in ATTENTION:
        from .attention import attention_row
        return attention_row(row, inputs, attrs, seeds)
    names = ['in%d' % i for i in range(len(inputs))]
    sym = _op_fn(op)(*[mx.sym.var(n) for n in names], name='op', **attrs)
    copy = op == 'LayerNorm' and str(row.get('variant', '')).startswith(COPY_VARIANT)
    if copy:   # two readers of the output: the rule's copy_out=1
        sym = mx.sym.Group([mx.sym.identity(sym, name='r1'), mx.sym.negative(sym, name='r2')])
    graph = substitute(load(sym), Policy('bfloat16', kernels='all'))   # the opt-in ops too
    if not any(n['op'].startswith('mxmp_') for n in graph['nodes']):
        row.update(mode='real', detail="mxmp's operator library is not available here (no "
                                       "compiler?): MXNet's kernel runs")
        return row
    lib = dump(graph)
    if op == 'Dropout':
        return _with_contract(_dropout_row(row, sym, lib, names, inputs, attrs, seeds), op)
    fe = be = 0.0
    for seed in seeds:
        rng = np.random.RandomState(seed)
        values = {n: _values(rng, shape, kind) for n, (shape, kind) in zip(names, inputs)}
        heads = [rng.normal(size=s) for s in
                 sym.infer_shape(**{n: v.shape for n, v in values.items()})[1]]
        results = []
        dtypes = {n: 'int32' if kind[0] == 'I' else 'float32' for n, (_, kind) in
                  zip(names, inputs)}
        for graph_sym in (sym, lib):
            args = {n: mx.nd.array(v, dtype=dtypes[n]) for n, v in values.items()}
            results.append(_run(graph_sym, args, {}, [n for n in names
                                                      if dtypes[n] == 'float32'], heads))
        (ref_f, ref_g), (got_f, got_g) = results
        fe = max([fe] + [_rel_err(g, r) for g, r in zip(got_f, ref_f)])
        be = max([be] + [_rel_err(g, r) for g, r in zip(got_g, ref_g)])
    bad = [w for w, e in (('forward', fe), ('backward', be)) if not e <= LIBRARY_TOL]
    if copy:
        bad += _copy_problems(graph, inputs, seeds)
    row.update(mode='real', fwd_err=fe, bwd_err=be, verdict='wrong' if bad else 'ok',
               detail=('the LayerNorm copy (copy_out=1, two readers): ' if copy else '') +
               "mxmp's library kernel vs MXNet's, float32 (tolerance 2**-16)" +
               ('; %s' % ', '.join(e if e.startswith('the ') else e + ' error above it'
                                   for e in bad) if bad else ''))
    return row if copy else _with_contract(row, op)   # (the plain variant runs the contract)


def _copy_problems(graph, inputs, seeds):
    """The LayerNorm copy variant's failures (list of str): the rule did not write
    ``copy_out=1``, or in bfloat16 (and float32) the library op with the copy does not give the
    bits of the op without it fed MXNet's ``add_n`` of the two gradients."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    from ..graph.ln_copy import COPY_OUT
    bad = [] if any(n.get('attrs', {}).get(COPY_OUT) == '1' for n in graph['nodes']) else [
        'the kernel rule did not write copy_out=1']
    for seed in seeds:
        rng = np.random.RandomState(seed)
        x, g, b = [_values(rng, shape, kind) for shape, kind in inputs]
        h0, h1 = rng.normal(size=x.shape), rng.normal(size=x.shape)
        for dtype in ('float32', bfloat16):
            got = []
            for with_copy in (True, False):
                xs, hs0, hs1 = [mx.nd.amp_cast(mx.nd.array(a), dtype=dtype) for a in (x, h0, h1)]
                gs, bs = mx.nd.array(g), mx.nd.array(b)
                for a in (xs, gs, bs):
                    a.attach_grad()
                with mx.autograd.record():
                    outs = mx.nd.mxmp_layer_norm(xs, gs, bs, copy_out=int(with_copy))
                if with_copy:
                    mx.autograd.backward([outs[0], outs[3]], [hs0, hs1])
                else:
                    outs[0].backward(mx.nd.add_n(hs0, hs1))
                got.append([mx.nd.amp_cast(a, dtype='float32').asnumpy().view(np.uint32)
                            for a in (outs[0], xs.grad, gs.grad, bs.grad)])
            if not all(np.array_equal(p, q) for p, q in zip(*got)):
                bad.append('the copy changes the bits in %s' % ('float32' if dtype == 'float32'
                                                                 else 'bfloat16'))
    return sorted(set(bad))


def _with_contract(row, op):
    """``row`` with the op's numerical contract (:mod:`.contract`: adversarial and random
    inputs, the library's float32 and bfloat16 errors against float64 within 4x MXNet's
    float32 op's (rounded to bfloat16 for the bfloat16 cases), NaN where the reference has NaN)
    folded in: a case that breaks it makes the row ``wrong`` and is named."""
    from .contract import CASES, FACTOR, run_contract
    if op not in CASES:
        return row
    cases = run_contract(op) + run_contract(op, dtype='bfloat16')
    broken = [c for c in cases if not c['ok']]
    if broken:
        row['verdict'] = 'wrong'
        row['detail'] += '; numerical contract broken: ' + '; '.join(
            '%s: %s (library %s, MXNet %s)' % (c['case'], c['detail'],
                                               ', '.join('%.1e' % e for e in c['lib']),
                                               ', '.join('%.1e' % e for e in c['mxnet']))
            for c in broken)
    else:
        row['detail'] += ('; numerical contract: %d adversarial and random cases (float32 and '
                          "bfloat16) within %gx MXNet's float32 error against float64, NaN as "
                          'the reference' % (len(cases), FACTOR))
    return row


def _dropout_row(row, sym, lib, names, inputs, attrs, seeds):
    """Dropout's masks are random: the library graph is checked against Dropout's definition
    (kept values x / (1 - p), the others 0; dropped fraction within :data:`SIGMAS` binomial
    deviations of p; gradient dy / (1 - p) where kept, 0 elsewhere; identity in inference) and
    against MXNet's Dropout in inference (equal)."""
    import mxnet as mx
    p = float(attrs.get('p', 0.5))
    fe = be = 0.0
    dropped, total = 0, 0
    for seed in seeds:
        rng = np.random.RandomState(seed)
        values = {n: _values(rng, shape, kind) for n, (shape, kind) in zip(names, inputs)}
        x = values[names[0]].astype(np.float32)
        head = rng.normal(size=x.shape)
        args = {n: mx.nd.array(v, dtype='float32') for n, v in values.items()}
        (y,), (dx,) = _run(lib, args, {}, names, [head])
        kept = y != 0
        fe = max(fe, _rel_err(np.where(kept, y, 0), np.where(kept, x / (1 - p), 0)))
        be = max(be, _rel_err(dx, np.where(kept, head.astype(np.float32) / (1 - p), 0)))
        dropped += int((~kept).sum())
        total += kept.size
        for graph in (lib, sym):   # inference: the identity, MXNet's as the library's
            exe = graph.bind(mx.cpu(), args={n: mx.nd.array(v, dtype='float32')
                                             for n, v in values.items()})
            fe = max(fe, _rel_err(exe.forward(is_train=False)[0].asnumpy(), x))
    sigma = (p * (1 - p) / total) ** 0.5
    off = abs(dropped / total - p) / sigma
    bad = [w for w, e in (('forward', fe), ('backward', be)) if not e <= LIBRARY_TOL]
    if off > SIGMAS:
        bad.append('dropped fraction %.4f for p=%g (%.1f sigma)' % (dropped / total, p, off))
    row.update(mode='real', fwd_err=fe, bwd_err=be, verdict='wrong' if bad else 'ok',
               detail="mxmp's library Dropout against Dropout's definition; dropped %.4f "
                      'for p=%g' % (dropped / total, p) + ('; %s' % ', '.join(bad) if bad else ''))
    return row
