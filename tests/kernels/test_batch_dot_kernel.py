"""mxmp's ``mxmp_batch_dot`` (MXNet's ``batch_dot`` with bfloat16 products and float32
accumulation, on the attention matmuls' GEMM) and the kernel rule that substitutes it for
``batch_dot`` in bfloat16 graphs on the ``avx512_bf16`` tier under ``Policy(kernels='all')``
(opt-in: GluonNLP's attention cell surrounds it with float32 ``transpose``, whose casts took
what the products saved; docs/benchmark.md).

Numbers come from a worker process per tier (tests/kernels/batch_dot_worker.py): under the
AVX2 cap the library runs its portable path. Inputs are bfloat16-representable, so the
float64 reference sees the values the kernel multiplies. Measured (Zen 4, the worker's four
cases): float32 in and out within 1.3e-7 of float64 (MXNet's float32 op: 1.2e-7), bfloat16 in
and out within 3.3e-3 (the output's rounding: at most 2**-8 of a value). Bounds: the
conformance suite's (2**-16 and 2**-8 + 2**-16).
"""
import json

import numpy as np
import pytest

import mxnet as mx
import mxmp
from mxmp._src.conformance.attention import BFLOAT16_TOL, FLOAT32_TOL
from mxmp._src.graph.kernel_rule import attention_pays
from mxmp._src.graph.kernel_undo import mxnet_ops
from mxmp._src.graph.symbol_json import load
from tier_run import needs_library, run_on_tiers



@pytest.fixture(scope='module')
def runs():
    return run_on_tiers('batch_dot_worker.py')


@needs_library
@pytest.mark.parametrize('tier', ['native', 'AVX2'])
def test_matches_float64_reference_in_float32_and_bfloat16(runs, tier):
    rows = runs[tier]['rows']
    assert [r['transpose'] for r in rows] == [[False, False], [False, True], [True, False],
                                              [True, True]]
    for row in rows:
        assert row['float32']['dtypes'] == ['float32'] * 3, row
        assert row['bfloat16']['dtypes'] == ['bfloat16'] * 3, row
        assert max(row['float32']['err']) <= FLOAT32_TOL, row
        assert max(row['bfloat16']['err']) <= BFLOAT16_TOL, row
        assert max(row['mxnet_float32_err']) <= FLOAT32_TOL, row
        # bfloat16 output: rounded, so not exact (a kernel returning float32 bits would be)
        assert max(row['bfloat16']['err']) > 0, row


@needs_library
def test_portable_path_gives_the_avx512_bf16_bits(runs):
    if 'avx512_bf16' not in open('/proc/cpuinfo').read():
        pytest.skip('this CPU has no avx512_bf16: both runs take the portable path')
    for fast, portable in zip(runs['native']['rows'], runs['AVX2']['rows']):
        for dtype in ('float32', 'bfloat16'):
            assert fast[dtype]['md5'] == portable[dtype]['md5'], fast['transpose']


class _Attention(mx.gluon.HybridBlock):
    """GluonNLP's DotProductAttentionCell core on (batch, length, units) queries, keys and
    values: batch_dot scores, softmax, batch_dot context."""

    def __init__(self, units=16, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = mx.gluon.nn.Dense(3 * units, flatten=False, prefix='proj_')

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's F)
        q, k, v = F.split(self.proj(x), num_outputs=3, axis=-1)
        att = F.softmax(F.batch_dot(q, k, transpose_b=True, name='qk'), axis=-1, name='sm')
        return F.batch_dot(att, v, name='av')


def _ops(sym):
    return [(n['op'], n['name']) for n in json.loads(sym.tojson(remove_amp_cast=False))['nodes']
            if n['op'] != 'null']


@needs_library
def test_rule_substitutes_batch_dot_under_kernels_all_on_the_avx512_bf16_tier(monkeypatch):
    sym = _Attention(prefix='att_')(mx.sym.var('data'))
    # the default keeps MXNet's float32 batch_dot
    got = _ops(mxmp.convert_symbol(sym, 'bfloat16'))
    assert ('batch_dot', 'att_qk') in got and ('batch_dot', 'att_av') in got, got
    got = _ops(mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', kernels='all')))
    if attention_pays():
        assert ('mxmp_batch_dot', 'att_qk') in got and ('mxmp_batch_dot', 'att_av') in got, got
        # bfloat16 products: the split's bfloat16 outputs feed them without a cast
        assert not any(op == 'amp_cast' and 'split' in name for op, name in got), got
    else:
        assert ('batch_dot', 'att_qk') in got, got
    # the user's float32 keeps MXNet's op; so does another tier
    got = _ops(mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', kernels='all',
                                                           fp32_ops=['batch_dot'])))
    assert ('batch_dot', 'att_qk') in got, got
    monkeypatch.setenv('DNNL_MAX_CPU_ISA', 'AVX2')
    got = _ops(mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', kernels='all')))
    assert ('batch_dot', 'att_qk') in got, got


@needs_library
def test_mxnet_ops_restores_batch_dot_with_its_transposes():
    from mxmp._src.graph.kernel_rule import apply_kernels
    sym = _Attention(prefix='att_')(mx.sym.var('data'))
    lib = apply_kernels(load(sym), 'all', attention=True)
    assert [n['op'] for n in lib['nodes'] if n['op'].startswith('mxmp_')] == [
        'mxmp_batch_dot', 'mxmp_batch_dot']
    back = mxnet_ops(lib)
    assert back['nodes'] == load(sym)['nodes'] and back['heads'] == load(sym)['heads']


@needs_library
@pytest.mark.real_kernels
def test_converted_block_trains_like_float32(tmp_path):
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.normal(size=(3, 7, 16)))
    head = mx.nd.array(rng.normal(size=(3, 7, 16)))
    results = []
    for policy in (None, mxmp.Policy('bfloat16', kernels='all')):
        mx.random.seed(0)
        net = _Attention(prefix='att_')
        net.initialize(mx.init.Xavier())
        net.hybridize()
        if policy is not None:
            net = mxmp.convert(net, policy=policy)
        x.attach_grad()
        with mx.autograd.record():
            y = net(x)
        y.backward(head)
        results.append((y.asnumpy(), x.grad.asnumpy(), net))
    (want, want_g, _), (got, got_g, net) = results
    assert got.dtype == np.float32
    if attention_pays():
        assert ('mxmp_batch_dot', 'att_qk') in _ops(mxmp.converted_graph(net))
    # bfloat16 projections, scores and context against float32 (seeds 0-4 measured below
    # 1e-2 of the largest value; bound about 3x)
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()
    assert np.abs(got_g - want_g).max() <= 3e-2 * np.abs(want_g).max()
    net.export(str(tmp_path / 'att'))
    with open(str(tmp_path / 'att-symbol.json')) as f:
        ops = [n['op'] for n in json.load(f)['nodes']]
    assert ops.count('batch_dot') == 2 and not any(op.startswith('mxmp_') for op in ops), ops
