"""The pass's reduction rule (mxmp/_src/graph/reduce_rule.py): float32 ``sum``/``mean`` over the
last axis, or over every axis but the first, computed as FullyConnected with a vector of ones.

The converted graph must give MXNet's reduction's values (float32 rounding only: the sum runs in
another order) and the same gradients, for every shape the graph meets, and the rule must
be named by explain, undone by remove_casts and switched off by ``Policy(reductions='mxnet')``.
Blocks here have no low-precision op, so converted and plain graphs both compute in float32.
"""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxmp

REL = 2e-6   # float32 sums of <= 4000 values in two orders (measured <= 3e-7 relative)


class Reductions(gluon.HybridBlock):
    """Every form the rule rewrites, and two it leaves alone (axis=1; keepdims with exclude)."""

    def hybrid_forward(self, F, x, w):
        # pylint: disable=arguments-differ
        y = F.broadcast_mul(x, w)
        last = F.sum(y, axis=-1)                               # (B, L)
        last_keep = F.mean(y, axis=-1, keepdims=True)          # (B, L, 1)
        rows = F.mean(F.broadcast_mul(last_keep, y), axis=0, exclude=True)   # (B,)
        kept = F.sum(y, axis=1)                                # not rewritten
        kept2 = F.sum(y, axis=0, exclude=True, keepdims=True)  # not rewritten
        return (F.sum(last * last, axis=1) + rows + F.sum(kept, axis=-1) +
                F.reshape(kept2, shape=(-1,)))


def _run(block, shapes, seed=0):
    rng = np.random.RandomState(seed)
    outs = []
    w = mx.nd.array(rng.uniform(0.5, 1.5, size=shapes[0][-1:]))
    for shape in shapes:
        x = mx.nd.array(rng.normal(size=shape))
        x.attach_grad()
        with autograd.record():
            y = block(x, w)
        y.backward(mx.nd.array(rng.normal(size=y.shape)))
        outs.append((y.asnumpy(), x.grad.asnumpy()))
    return outs


def _converted(reductions):
    block = Reductions()
    return mxmp.convert(block, policy=mxmp.Policy('bfloat16', reductions=reductions))


SHAPES = [(4, 7, 300), (3, 11, 300), (4, 7, 300)]   # the graph meets new shapes, then an old one


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_values_and_gradients_match_mxnet_reduction(seed):
    plain = Reductions()
    plain.hybridize()
    ref = _run(plain, SHAPES, seed)
    for reductions in ('auto', 'mxnet'):
        block = _converted(reductions)
        got = _run(block, SHAPES, seed)
        for (y, g), (ry, rg) in zip(got, ref):
            assert y.shape == ry.shape and g.shape == rg.shape
            assert np.abs(y - ry).max() <= REL * np.abs(ry).max()
            assert np.abs(g - rg).max() <= REL * np.abs(rg).max()
        # inference (the fused twin graph where the real kernels run): the same values
        rng = np.random.RandomState(seed)
        w = mx.nd.array(rng.uniform(0.5, 1.5, size=SHAPES[0][-1:]))
        x = mx.nd.array(rng.normal(size=SHAPES[0]))
        y, ry = block(x, w).asnumpy(), plain(x, w).asnumpy()
        assert np.abs(y - ry).max() <= REL * np.abs(ry).max()


def _graph(block):
    return block._cached_graph[1]


def test_graph_explain_and_remove_casts():
    block = _converted('auto')
    _run(block, SHAPES[:1])
    sym = _graph(block)
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    gemv = [n for n in nodes if n['op'] == 'FullyConnected']
    assert len(gemv) == 4   # sum(y), mean keepdims, mean exclude, sum(kept)
    rows = {r.name: r for r in mxmp.explain(sym)}
    for node in gemv:
        assert rows[node['name']].dtype == 'float32'
        assert rows[node['name']].rule.startswith('reduction rule')
    plain = Reductions()
    plain.hybridize()
    _run(plain, SHAPES[:1])

    def ops(s):
        return sorted(n['op'] for n in json.loads(s.tojson())['nodes'])
    assert ops(mxmp.remove_casts(sym)) == ops(_graph(plain))
    # The two forms the rule does not take stay MXNet's reductions.
    ids = {n['name'][len(block.prefix):]: k for k, n in enumerate(nodes)}
    for name in ('sum1', 'sum2', 'sum3'):
        assert 'reduction rule' not in rows[block.prefix + name].rule
    for name in ('sum1', 'sum2'):
        assert nodes[ids[name]]['inputs'][0][0] == ids['broadcast_mul0']


def test_policy_switches_it_off():
    block = _converted('mxnet')
    _run(block, SHAPES[:1])
    nodes = json.loads(_graph(block).tojson(remove_amp_cast=False))['nodes']
    assert not [n for n in nodes if n['op'] == 'FullyConnected']
    off = mxmp.Policy('bfloat16', reductions='mxnet')
    assert all('reduction rule' not in r.rule for r in mxmp.explain(_graph(block), policy=off))
    assert any('reduction rule' in r.rule for r in mxmp.explain(_graph(block)))


def test_float16_target_leaves_reductions_alone():
    sym = mx.sym.sum(mx.sym.var('data'), axis=-1, name='s')
    conv = mxmp.convert_symbol(sym, 'float16')
    assert [n['op'] for n in json.loads(conv.tojson(remove_amp_cast=False))['nodes']
            if n['op'] != 'null' and n['op'] not in ('amp_cast', 'amp_multicast')] == ['sum']


def test_one_dimensional_input():
    sym = mx.sym.sum(mx.sym.var('data'), axis=-1, name='s')
    conv = mxmp.convert_symbol(sym, 'bfloat16')
    x = np.arange(1, 301, dtype='float32')
    out = conv.eval(data=mx.nd.array(x))[0]
    assert out.shape == (1,) and out.asscalar() == x.sum()


def test_bad_policy_value():
    with pytest.raises(ValueError, match="reductions='fast'"):
        mxmp.Policy('bfloat16', reductions='fast')


def test_converting_twice_changes_nothing():
    data = mx.sym.var('data')
    sym = mx.sym.mean(mx.sym.sum(data, axis=-1, keepdims=True) * data, axis=0, exclude=True)
    once = mxmp.convert_symbol(sym, 'bfloat16')
    twice = mxmp.convert_symbol(once, 'bfloat16')
    assert once.tojson(remove_amp_cast=False) == twice.tojson(remove_amp_cast=False)
    assert mxmp.remove_casts(once).tojson() == sym.tojson()


@pytest.mark.parametrize('dtype', ['int32', 'float64'])
def test_integer_and_float64_reductions_keep_mxnet_kernel(dtype):
    data = mx.sym.var('data')
    sym = mx.sym.Group([mx.sym.sum(data, axis=-1), mx.sym.mean(data, axis=0, exclude=True)])
    conv = mxmp.convert_symbol(sym, 'bfloat16', data_dtypes={'data': dtype})
    ops = [n['op'] for n in json.loads(conv.tojson(remove_amp_cast=False))['nodes']]
    assert 'FullyConnected' not in ops and ops.count('sum') == 1 and ops.count('mean') == 1
    x = mx.nd.array(np.arange(24).reshape(2, 3, 4), dtype=dtype)
    for out, ref in zip(conv.eval(data=x), sym.eval(data=x)):
        assert out.dtype == ref.dtype
        np.testing.assert_array_equal(out.asnumpy(), ref.asnumpy())
