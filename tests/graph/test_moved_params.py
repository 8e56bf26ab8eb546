"""``cast_params`` stores in the target dtype the weights that reach low-precision ops only
through Reshape/Concat/stack/expand_dims of weights alone (``Policy.cast_moved_params``), as
GluonNLP's BERT does with its query/key/value weights and biases: exact, since those ops only
move values (checked here on every kernel the machine has), and the same training numbers as
keeping them float32 with a cast after the concatenation."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.dtypes import dtype_name, mx_dtype
from mxmp._src.graph.moved_params import MOVE_OPS

HEADS, UNITS, IN = 2, 8, 6


class QKV(gluon.HybridBlock):
    """GluonNLP 0.10's self-attention projection (model/bert.py): three weights reshaped per
    head and concatenated, three biases stacked, one FullyConnected."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            for name in ('query', 'key', 'value'):
                setattr(self, name + '_weight', self.params.get(
                    name + '_weight', shape=(UNITS, IN), init=mx.init.Normal(0.5)))
                setattr(self, name + '_bias', self.params.get(
                    name + '_bias', shape=(UNITS,), init=mx.init.Normal(0.5)))

    def hybrid_forward(self, F, x, query_weight, key_weight, value_weight, query_bias,
                       key_bias, value_bias):
        ws = [w.reshape(shape=(HEADS, -1, 0), reverse=True)
              for w in (query_weight, key_weight, value_weight)]
        weight = F.concat(*ws, dim=-2).reshape(shape=(-1, 0), reverse=True)
        bs = [b.reshape(shape=(HEADS, -1), reverse=True)
              for b in (query_bias, key_bias, value_bias)]
        bias = F.stack(*bs, axis=1).reshape(-1)
        return F.FullyConnected(x, weight, bias, num_hidden=3 * UNITS, flatten=False)


def _symbol():
    net = QKV(prefix='qkv_')
    net.initialize()
    net.hybridize()
    net(nd.ones((2, IN)))
    return net._cached_graph[1]


def test_explain_names_the_rule_and_the_moves_compute_in_bfloat16():
    rows = {r.name: r for r in mxmp.explain(_symbol(), 'bfloat16', cast_params=True)}
    stored = sorted(n for n, r in rows.items() if r.op == 'null' and r.dtype == 'bfloat16')
    assert stored == sorted('qkv_%s_%s' % (n, k) for n in ('query', 'key', 'value')
                            for k in ('weight', 'bias'))
    assert all('cast_moved_params' in rows[n].rule for n in stored)
    assert {r.op for r in rows.values() if r.op in MOVE_OPS and r.dtype == 'bfloat16'} == \
        {'Reshape', 'Concat', 'stack'}
    assert all(r.dtype == 'bfloat16' for r in rows.values() if r.op in MOVE_OPS)


def test_turned_off_they_stay_float32_and_the_concatenation_is_cast():
    policy = mxmp.Policy('bfloat16', param_dtype='bfloat16', cast_moved_params=False)
    rows = mxmp.explain(_symbol(), policy=policy)
    assert all(r.dtype == 'float32' for r in rows if r.op == 'null' and r.name != 'data')
    def weight_casts(policy):
        out = mxmp.convert_symbol(_symbol(), policy=policy)
        return sorted(n for n in out.get_internals().list_outputs()
                      if 'amp_cast' in n and not n.startswith(('data', 'qkv_fullyconnected')))
    # the concatenated weight and the stacked bias are cast; with the rule nothing is
    assert weight_casts(policy) == ['qkv_reshape3_amp_cast_bfloat16_output',
                                    'qkv_reshape7_amp_cast_bfloat16_output']
    assert weight_casts(policy.replace(cast_moved_params=True)) == []


def test_a_weight_moved_together_with_data_or_into_a_float32_op_stays_float32():
    w, x = mx.sym.var('w', shape=(4, 3)), mx.sym.var('data')
    with_data = mx.sym.FullyConnected(x, mx.sym.concat(w, x, dim=0), num_hidden=8,
                                      no_bias=True)
    into_float32 = mx.sym.softmax(mx.sym.reshape(w, shape=(-1,)))
    as_output = mx.sym.Group([mx.sym.FullyConnected(x, mx.sym.reshape(w, shape=(4, 3)),
                                                    num_hidden=4, no_bias=True),
                              mx.sym.reshape(w, shape=(4, 3))])
    for sym in (with_data, into_float32):
        rows = mxmp.explain(sym, 'bfloat16', cast_params=True)
        assert [r.dtype for r in rows if r.name == 'w'] == ['float32']
    rows = mxmp.explain(as_output, 'bfloat16', cast_params=True)
    assert all('cast_moved_params' not in r.rule for r in rows)


def test_bfloat16_moves_are_exact_forward_and_backward():
    rng = np.random.RandomState(0)
    bf16 = mx_dtype('bfloat16')
    xs = [nd.amp_cast(nd.array(rng.randn(3, 5, 7)), dtype=bf16) for _ in range(3)]
    f32 = [nd.amp_cast(x, dtype='float32') for x in xs]
    ops = {'Concat': lambda a: nd.concat(*a, dim=-2), 'stack': lambda a: nd.stack(*a, axis=1),
           'Reshape': lambda a: a[0].reshape((-1, 7)), 'expand_dims':
           lambda a: nd.expand_dims(a[0], axis=1)}
    assert set(ops) == MOVE_OPS
    for op, fn in ops.items():
        for x in xs + f32:
            x.attach_grad()   # fresh zero gradients: Reshape/expand_dims use the first only
        with autograd.record():
            y = fn(xs)
        head = nd.amp_cast(nd.array(rng.randn(*y.shape)), dtype=bf16)
        y.backward(head)
        with autograd.record():
            y32 = fn(f32)
        y32.backward(nd.amp_cast(head, dtype='float32'))
        assert dtype_name(y.dtype) == 'bfloat16', op
        assert np.array_equal(nd.amp_cast(y, dtype='float32').asnumpy(), y32.asnumpy()), op
        for x, x32 in zip(xs, f32):
            assert np.array_equal(nd.amp_cast(x.grad, dtype='float32').asnumpy(),
                                  x32.grad.asnumpy()), op


def _train(moved, emulate, steps=3):
    mx.random.seed(3)
    net = QKV(prefix='qkv_')
    net.initialize()
    policy = mxmp.Policy('bfloat16', param_dtype='bfloat16', cast_moved_params=moved,
                         emulate=emulate)
    net = mxmp.convert(net, policy=policy)
    net.hybridize(static_alloc=True)
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1,
                                                         'momentum': 0.9})
    x = nd.array(np.random.RandomState(1).randn(4, 5, IN))
    losses = []
    for _ in range(steps):
        with autograd.record():
            loss = (net(x) ** 2).mean()
        loss.backward()
        trainer.step(1)
        losses.append(loss.asscalar())
    w = net.collect_params()['qkv_key_weight']
    master = trainer.master_weights(w)[0] if moved else w.data()
    return losses, dtype_name(w.data().dtype), master.asnumpy()


@pytest.mark.parametrize('emulate', [True, pytest.param(False, marks=pytest.mark.skipif(
    not mxmp.lp_kernels_available('bfloat16'), reason='no bfloat16 kernels'))])
def test_training_numbers_are_those_of_float32_weights_cast_after_the_concatenation(emulate):
    moved, dtype_moved, master = _train(True, emulate)
    kept, dtype_kept, weight = _train(False, emulate)
    assert (dtype_moved, dtype_kept) == ('bfloat16', 'float32')
    assert moved == kept
    if emulate:
        # a bfloat16 weight has a bfloat16 gradient; the emulated FullyConnected gives the
        # float32 weight an unrounded one: measured 8.8e-5 apart after 3 steps (weights ~0.5)
        assert np.abs(master - weight).max() < 1e-3
    else:   # the real kernels' gradient is bfloat16 either way: bit-identical
        assert np.array_equal(master, weight)
    assert moved[-1] < moved[0]   # it trains
