"""mxmp's attention matmuls (``mxmp_selfatt_qk/valatt``, ``mxmp_encdec_qk/valatt``: bfloat16
products, float32 accumulation) and the kernel rule that substitutes them for MXNet's
``_contrib_interleaved_matmul_*`` in bfloat16 graphs on the ``avx512_bf16`` tier.

Numbers come from a worker process (tests/kernels/attention_worker.py) per tier: the library
reads ``DNNL_MAX_CPU_ISA`` once, and under the AVX2 cap it runs its portable path. Inputs are
bfloat16-representable, so the float64 reference sees the values the kernel multiplies.
Measured (Zen 4, seeds per op, three shapes): float32 in and out within 3.2e-7 of float64
(relative max-norm), as MXNet's float32 op (3.2e-7); bfloat16 in and out within 3.1e-3, the
output's rounding to nearest even (at most 2**-8 of a value); the portable path gives the
AVX512-BF16 path's bits. Bounds: the conformance suite's (mxmp/_src/conformance/attention.py,
2**-16 and 2**-8 + 2**-16).
"""
import json

import numpy as np
import pytest

import mxnet as mx
import mxmp
from mxmp._src.conformance.attention import BFLOAT16_TOL, FLOAT32_TOL
from mxmp._src.graph.kernel_rule import ATTENTION, apply_kernels, attention_pays
from mxmp._src.graph.kernel_undo import mxnet_ops
from mxmp._src.graph.symbol_json import load
from tier_run import needs_library, run_on_tiers



@pytest.fixture(scope='module')
def runs():
    return run_on_tiers('attention_worker.py')


@needs_library
@pytest.mark.parametrize('tier', ['native', 'AVX2'])
def test_matches_float64_reference_in_float32_and_bfloat16(runs, tier):
    run = runs[tier]
    assert len(run['rows']) == 12
    for row in run['rows']:
        n = 2 if row['op'] == 'selfatt_qk' else 3   # output and input gradients
        assert len(row['float32']['err']) == len(row['bfloat16']['err']) == n, row
        assert row['float32']['dtypes'] == ['float32'] * n, row
        assert row['bfloat16']['dtypes'] == ['bfloat16'] * n, row
        assert max(row['float32']['err']) <= FLOAT32_TOL, row
        assert max(row['bfloat16']['err']) <= BFLOAT16_TOL, row
        # MXNet's float32 op on the same values is no closer than the bound either
        assert max(row['mxnet_float32_err']) <= FLOAT32_TOL, row
    # a NaN in one query makes that row of scores NaN, nothing else
    assert run['nan_rows'] == [1] and run['nan_cols'] == [0, 1, 2, 3]


@needs_library
def test_portable_path_gives_the_avx512_bf16_bits(runs):
    if 'avx512_bf16' not in open('/proc/cpuinfo').read():
        pytest.skip('this CPU has no avx512_bf16: both runs take the portable path')
    for fast, portable in zip(runs['native']['rows'], runs['AVX2']['rows']):
        for dtype in ('float32', 'bfloat16'):
            assert fast[dtype]['md5'] == portable[dtype]['md5'], (fast['op'], fast['shape'])


class _SelfAttention(mx.gluon.HybridBlock):
    """GluonNLP's self-attention core: projection, qk, softmax, valatt, projection."""

    def __init__(self, heads=2, units=16, **kwargs):
        super().__init__(**kwargs)
        self.heads = heads
        with self.name_scope():
            self.proj = mx.gluon.nn.Dense(3 * units, flatten=False, prefix='proj_')
            self.out = mx.gluon.nn.Dense(units, flatten=False, prefix='out_')

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's F)
        qkv = self.proj(x)
        scores = F.contrib.interleaved_matmul_selfatt_qk(qkv, heads=self.heads, name='qk')
        att = F.softmax(scores, axis=-1, name='sm')
        ctx = F.contrib.interleaved_matmul_selfatt_valatt(qkv, att, heads=self.heads,
                                                          name='va')
        return self.out(ctx)


def _ops(sym):
    return [(n['op'], n['name']) for n in json.loads(sym.tojson(remove_amp_cast=False))['nodes']
            if n['op'] != 'null']


def _sym():
    return _SelfAttention(prefix='att_')(mx.sym.var('data'))


@needs_library
def test_rule_puts_the_library_ops_in_bfloat16_without_casts_on_the_avx512_bf16_tier():
    got = _ops(mxmp.convert_symbol(_sym(), 'bfloat16'))
    if attention_pays():
        assert got == [
            ('amp_cast', 'data_amp_cast_bfloat16'),
            ('amp_cast', 'att_proj_weight_amp_cast_bfloat16'),
            ('amp_cast', 'att_proj_bias_amp_cast_bfloat16'),
            ('FullyConnected', 'att_proj_fwd'),
            ('mxmp_selfatt_qk', 'att_qk'),                   # bfloat16 QKV, bfloat16 scores
            ('amp_cast', 'att_qk_amp_cast_float32'),
            ('softmax', 'att_sm'),
            ('amp_cast', 'att_sm_amp_cast_bfloat16'),
            ('mxmp_selfatt_valatt', 'att_va'),               # bfloat16 in and out
            ('amp_cast', 'att_out_weight_amp_cast_bfloat16'),
            ('amp_cast', 'att_out_bias_amp_cast_bfloat16'),
            ('FullyConnected', 'att_out_fwd'),
            ('amp_cast', 'att_out_fwd_amp_cast_float32')], got
    else:   # MXNet's float32 ops between casts
        assert ('_contrib_interleaved_matmul_selfatt_qk', 'att_qk') in got, got
        assert not any(op.startswith('mxmp_selfatt') for op, _ in got), got


@needs_library
def test_rule_keeps_mxnet_ops_off_the_avx512_bf16_tier_in_float32_graphs_and_on_request(
        monkeypatch):
    sym = _sym()
    mxnet_op = '_contrib_interleaved_matmul_selfatt_qk'
    # float32 graphs (the "float32 with mxmp's kernels" baseline): the products stay float32
    assert all(n['op'] not in ('mxmp_selfatt_qk', 'mxmp_selfatt_valatt')
               for n in apply_kernels(load(sym), 'all')['nodes'])
    # the user's float32 (by op or by node name) and follow classes keep MXNet's float32 op
    for policy in (mxmp.Policy('bfloat16', kernels='mxnet'),
                   mxmp.Policy('bfloat16', fp32_ops=[mxnet_op]),
                   mxmp.Policy('bfloat16', follow_ops=[mxnet_op]),
                   mxmp.Policy('bfloat16', excluded_names=['att_qk'])):
        got = _ops(mxmp.convert_symbol(sym, policy=policy))
        assert (mxnet_op, 'att_qk') in got, (policy, got)
    # lp_ops asks for what the library op does
    got = _ops(mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', lp_ops=[mxnet_op])))
    assert (('mxmp_selfatt_qk', 'att_qk') in got) == attention_pays(), got
    monkeypatch.setenv('DNNL_MAX_CPU_ISA', 'AVX2')   # the rule reads the tier per conversion
    assert not attention_pays()
    assert (mxnet_op, 'att_qk') in _ops(mxmp.convert_symbol(sym, 'bfloat16'))


@needs_library
@pytest.mark.real_kernels
def test_converted_block_trains_like_float32_and_exports_mxnet_ops(tmp_path):
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.normal(size=(7, 3, 16)))
    head = mx.nd.array(rng.normal(size=(7, 3, 16)))
    results = []
    for convert in (False, True):
        mx.random.seed(0)
        net = _SelfAttention(prefix='att_')
        net.initialize(mx.init.Xavier())
        net.hybridize()
        if convert:
            net = mxmp.convert(net, 'bfloat16')
        x.attach_grad()
        with mx.autograd.record():
            y = net(x)
        y.backward(head)
        results.append((y.asnumpy(), x.grad.asnumpy(), net))
    (want, want_g, _), (got, got_g, net) = results
    assert got.dtype == np.float32
    if attention_pays():
        assert {'mxmp_selfatt_qk', 'mxmp_selfatt_valatt'} <= {
            op for op, _ in _ops(mxmp.converted_graph(net))}
    # bfloat16 projections, scores and probabilities against float32: measured (seeds 0-4,
    # Zen 4) output 4.0e-3 to 7.1e-3 and input gradient 4.1e-3 to 6.9e-3 of the largest
    # value; bound about 3x
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    assert np.abs(got_g - want_g).max() <= 2e-2 * np.abs(want_g).max()
    net.export(str(tmp_path / 'att'))
    with open(str(tmp_path / 'att-symbol.json')) as f:
        ops = {n['op'] for n in json.load(f)['nodes']}
    assert not any(op.startswith('mxmp_') for op in ops), ops
    assert set(ATTENTION) & ops == {'_contrib_interleaved_matmul_selfatt_qk',
                                    '_contrib_interleaved_matmul_selfatt_valatt'}


@needs_library
def test_mxnet_ops_restores_the_interleaved_ops_with_their_heads():
    sym = _sym()
    lib = apply_kernels(load(sym), 'auto', attention=True)
    assert [n['op'] for n in lib['nodes'] if n['op'].startswith('mxmp_')] == [
        'mxmp_selfatt_qk', 'mxmp_selfatt_valatt']
    back = mxnet_ops(lib)
    assert back['nodes'] == load(sym)['nodes'] and back['heads'] == load(sym)['heads']


@needs_library
@pytest.mark.parametrize('call, message', [
    (lambda: mx.nd.mxmp_selfatt_qk(mx.nd.zeros((4, 2, 10)), heads=3),
     'the first input must be (seq, batch, 3 * heads * head_dim) with heads=3, got (4, 2, 10)'),
    (lambda: mx.nd.mxmp_selfatt_qk(mx.nd.zeros((4, 2, 12)), heads=0),
     'heads must be a positive integer, got 0'),
    (lambda: mx.nd.mxmp_selfatt_valatt(mx.nd.zeros((4, 2, 12)), mx.nd.zeros((4, 4, 5)),
                                       heads=2),
     'attention must be (4, 4, 4) for queries_keys_values (4, 2, 12), got (4, 4, 5)'),
    (lambda: mx.nd.mxmp_encdec_qk(mx.nd.zeros((4, 2, 6)), mx.nd.zeros((5, 2, 6)), heads=2),
     'keys_values must be (seq_k, 2, 12) for queries (4, 2, 6), got (5, 2, 6)'),
    (lambda: mx.nd.mxmp_selfatt_qk(mx.nd.zeros((4, 2, 12), dtype='float64'), heads=2),
     'inputs must be float32 or bfloat16, got float64'),
])
def test_bad_inputs_are_clear_errors(call, message):
    with pytest.raises(mx.base.MXNetError) as err:
        call().wait_to_read()
    assert message in str(err.value)
