"""The kernel rule's self-attention pair: where the QKV projection's output is read by one
``selfatt_qk`` and one ``selfatt_valatt`` alone, ``mxmp_selfatt_qk`` (``emit_v=1``) also outputs
the values and ``mxmp_selfatt_valatt`` (``v_only=1``) reads them, so that MXNet no longer sums
two gradients of the whole tensor (an ``add_n`` per attention layer).

The same arithmetic as the two ops reading qkv: the workers compare bits (float32 and bfloat16,
odd sizes, NaN and inf; native and under ``DNNL_MAX_CPU_ISA=AVX2``), and bert_tiny's losses and
parameters after 3 SGD steps against the rule's graph without the pair. The only difference the
contract allows is the sign of a zero (the old ``add_n`` adds +0 to every element): measured
none, bit for bit.
"""
import json

import numpy as np
import pytest

import mxnet as mx
import mxmp
from mxmp._src.graph import selfatt_pair
from mxmp._src.graph.kernel_rule import apply_kernels, attention_pays
from mxmp._src.graph.rule_notes import kernel_rule_of as rule_of
from mxmp._src.graph.kernel_undo import mxnet_ops
from mxmp._src.graph.strip import strip
from mxmp._src.graph.symbol_json import load
from tier_run import exported, needs_library, run_on_tier, run_on_tiers

QK = '_contrib_interleaved_matmul_selfatt_qk'
VA = '_contrib_interleaved_matmul_selfatt_valatt'


@pytest.fixture(scope='module')
def runs():
    return run_on_tiers('selfatt_pair_worker.py')


@needs_library
@pytest.mark.parametrize('tier', ['native', 'AVX2'])
def test_pair_computes_the_two_ops_numbers_bit_for_bit(runs, tier):
    run = runs[tier]
    assert len(run['rows']) == 12   # 3 shapes x finite/NaN-inf x float32/bfloat16
    for row in run['rows']:
        assert row['dtypes'] == row['want_dtypes'] == [row['dtype']], row
        for key in ('scores', 'ctx', 'dqkv', 'datt', 'v'):
            assert row[key]['equal'] and not row[key]['other'], (key, row)
    # the values' output unread: zeros in the values' part of dqkv, as without the pair
    assert run['unread'] == {'equal': True, 'bits': True, 'other': False,
                             'values_zero': True}


def _attention(qkv, heads=2, heads_va=None, name=''):
    scores = mx.sym.contrib.interleaved_matmul_selfatt_qk(qkv, heads=heads, name=name + 'qk')
    att = mx.sym.softmax(scores, axis=-1, name=name + 'sm')
    return mx.sym.contrib.interleaved_matmul_selfatt_valatt(
        qkv, att, heads=heads_va or heads, name=name + 'va')


def _sym():
    qkv = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=48, flatten=False, name='proj')
    return _attention(qkv)


def _by_name(js):
    return {n['name']: (i, n) for i, n in enumerate(js['nodes'])}


@needs_library
@pytest.mark.parametrize('variable', [False, True])
def test_rule_pairs_the_two_readers_and_mxnet_ops_undoes_it(variable):
    sym = _attention(mx.sym.var('qkv')) if variable else _sym()
    lib = apply_kernels(load(sym), 'auto', attention=True)
    nodes = _by_name(lib)
    qk_id, qk = nodes['qk']
    _, va = nodes['va']
    assert (qk['op'], qk['attrs']['emit_v']) == ('mxmp_selfatt_qk', '1')
    assert (va['op'], va['attrs']['v_only']) == ('mxmp_selfatt_valatt', '1')
    assert 'emit_v' not in va['attrs'] and 'v_only' not in qk['attrs']
    assert va['inputs'][0] == [qk_id, 1, 0]   # the values qk emits, not qkv
    # a variable qkv: the rule's one copy, for qk (whose backward writes the whole gradient)
    copies = [n for n in lib['nodes'] if n['op'] == '_copy']
    assert len(copies) == (1 if variable else 0)
    assert 'self-attention pair' in rule_of(qk) and 'emit_v=1' in rule_of(qk)
    assert 'v_only=1' in rule_of(va)
    # files: MXNet's two ops reading qkv, as the graph before the rule
    for back in (mxnet_ops(lib), strip(lib)):   # files; remove_casts
        assert back['nodes'] == load(sym)['nodes'] and back['heads'] == load(sym)['heads']
    out = mx.sym.load_json(json.dumps(back)).infer_shape(
        **({'qkv': (5, 3, 48)} if variable else {'data': (5, 3, 16)}))[1]
    assert out == [(5, 3, 16)]


@needs_library
@pytest.mark.parametrize('case', ['third reader', 'other heads', 'graph output',
                                  'two valatts', 'valatt first'])
def test_rule_keeps_both_ops_reading_qkv_otherwise(case):
    qkv = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=48, flatten=False, name='proj')
    if case == 'third reader':
        sym = mx.sym.Group([_attention(qkv), mx.sym.sum(qkv, name='other')])
    elif case == 'other heads':   # 48 = 3 * 2 * 8 = 3 * 4 * 4: both valid, not one geometry
        sym = _attention(qkv, heads=2, heads_va=4)
    elif case == 'graph output':
        sym = mx.sym.Group([_attention(qkv), qkv])
    elif case == 'two valatts':
        ctx = _attention(qkv)
        att = mx.sym.var('att')
        sym = mx.sym.Group([ctx, mx.sym.contrib.interleaved_matmul_selfatt_valatt(
            qkv, att, heads=2, name='va2')])
    else:   # the valatt's attention does not come from this qk: valatt may come first
        va = mx.sym.contrib.interleaved_matmul_selfatt_valatt(qkv, mx.sym.var('att'),
                                                              heads=2, name='va')
        qk = mx.sym.contrib.interleaved_matmul_selfatt_qk(qkv, heads=2, name='qk')
        sym = mx.sym.Group([va, qk])
    js = load(sym)
    lib = apply_kernels(js, 'auto', attention=True)
    ops = [n for n in lib['nodes'] if n['op'].startswith('mxmp_selfatt')]
    assert len(ops) == len([n for n in js['nodes'] if n['op'] in (QK, VA)]) >= 2
    if case == 'valatt first':   # the graph's order put valatt before qk: no pair
        assert [n['name'] for n in js['nodes'] if n['op'] in (QK, VA)] == ['va', 'qk']
    for node in ops:
        assert 'emit_v' not in node['attrs'] and 'v_only' not in node['attrs'], (case, node)
        assert lib['nodes'][node['inputs'][0][0]]['name'] == 'proj', case


@needs_library
@pytest.mark.parametrize('variable', [False, True])
def test_inference_only_graphs_drop_the_pair_with_the_same_outputs(variable):
    """A graph that only runs inference (the fused twin, mxmp.freeze) has no backward to write
    the QKV gradient: the pair goes (qk one output, valatt reading qkv again, both still the
    library's ops) and the output keeps its bits."""
    from mxmp._src.graph.kernel_undo import inference_only
    sym = _attention(mx.sym.var('qkv')) if variable else _sym()
    lib = apply_kernels(load(sym), 'auto', attention=True)
    assert any(selfatt_pair.pair_source(n) for n in lib['nodes'])
    back = inference_only(lib)
    nodes = _by_name(back)
    _, qk = nodes['qk']
    _, va = nodes['va']
    assert (qk['op'], va['op']) == ('mxmp_selfatt_qk', 'mxmp_selfatt_valatt')
    assert 'emit_v' not in qk['attrs'] and 'v_only' not in va['attrs']
    assert va['inputs'][0] == qk['inputs'][0]   # both read qkv (or its copy)
    assert selfatt_pair.drop_pairs(back) is back   # nothing left to drop
    shape = {'qkv': (5, 3, 48)} if variable else {'data': (5, 3, 16)}
    graph = mx.sym.load_json(json.dumps(lib))
    rng = np.random.RandomState(0)
    args = {k: mx.nd.array(rng.normal(size=v)) for k, v in
            zip(graph.list_arguments(), graph.infer_shape(**shape)[0])}
    got = [mx.sym.load_json(json.dumps(g)).eval(mx.cpu(), **args)[0].asnumpy()
           for g in (lib, back)]
    assert got[0].tobytes() == got[1].tobytes()


@needs_library
def test_explain_names_the_pair_where_the_rule_makes_it():
    rows = {r.name: r for r in mxmp.explain(_sym(), 'bfloat16')}
    assert ('self-attention pair with va' in rows['qk'].rule) == attention_pays(), rows['qk']
    assert ('self-attention pair with qk' in rows['va'].rule) == attention_pays(), rows['va']
    rows = {r.name: r for r in mxmp.explain(_sym(), policy=mxmp.Policy('bfloat16',
                                                                       kernels='mxnet'))}
    assert 'pair' not in rows['qk'].rule


@needs_library
@pytest.mark.parametrize('call, message', [
    (lambda: mx.nd.mxmp_selfatt_valatt(mx.nd.zeros((4, 2, 12)), mx.nd.zeros((4, 4, 4)),
                                       heads=2, emit_v=1),
     'the attribute emit_v belongs to mxmp_selfatt_qk only'),
    (lambda: mx.nd.mxmp_selfatt_qk(mx.nd.zeros((4, 2, 12)), heads=2, v_only=1),
     'the attribute v_only belongs to mxmp_selfatt_valatt only'),
    (lambda: mx.nd.mxmp_selfatt_qk(mx.nd.zeros((4, 2, 12)), heads=2, emit_v=2),
     "emit_v must be 0 or 1, got '2'"),
    (lambda: mx.nd.mxmp_selfatt_valatt(mx.nd.zeros((4, 2, 5)), mx.nd.zeros((4, 4, 4)),
                                       heads=2, v_only=1),
     'the first input must be (seq, batch, 1 * heads * head_dim) with heads=2 (v_only: the '
     'values alone), got (4, 2, 5)'),
    (lambda: mx.nd.mxmp_selfatt_valatt(mx.nd.zeros((4, 2, 6)), mx.nd.zeros((4, 4, 5)),
                                       heads=2, v_only=1),
     'attention must be (4, 4, 4)'),
])
def test_bad_pair_attributes_are_clear_errors(call, message):
    with pytest.raises(mx.base.MXNetError) as err:
        out = call()
        for o in (out if isinstance(out, list) else [out]):
            o.wait_to_read()
    assert message in str(err.value)


@needs_library
@pytest.mark.real_kernels
def test_bert_tiny_trains_bit_for_bit_without_the_qkv_gradient_sum():
    """bert_tiny (2 layers) converted to bfloat16, 3 SGD steps with and without the pair."""
    pytest.importorskip('gluonnlp', reason="the BERT models need the optional extra: pip "
                                           "install -e '.[bert]'")
    run = run_on_tier('selfatt_pair_bert_worker.py', None)
    if not run['attention_pays']:
        pytest.skip("the library's attention matmuls replace MXNet's on the avx512_bf16 tier "
                    'only')
    pair, no_pair = run['pair'], run['no_pair']
    assert len(pair['emit_v']) == len(pair['v_only']) == pair['qk'] == 2
    assert no_pair['emit_v'] == no_pair['v_only'] == []
    # one add_n fewer per layer: the QKV gradient's (the two LayerNorm outputs' stay)
    assert no_pair['add_n_calls'] - pair['add_n_calls'] == 2, run
    assert pair['losses'] == no_pair['losses']   # float32 bits of each step's losses
    assert pair['params'] == no_pair['params']   # md5 of every parameter after 3 steps


class _SelfAttention(mx.gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = mx.gluon.nn.Dense(48, flatten=False, prefix='proj_')

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's F)
        qkv = self.proj(x)
        att = F.softmax(F.contrib.interleaved_matmul_selfatt_qk(qkv, heads=2, name='qk'))
        return F.contrib.interleaved_matmul_selfatt_valatt(qkv, att, heads=2, name='va')


@needs_library
@pytest.mark.real_kernels
def test_export_holds_the_graph_without_the_pair(tmp_path, monkeypatch):
    files = []
    for pair in (True, False):
        if not pair:
            monkeypatch.setattr(selfatt_pair, 'selfatt_pairs', lambda js, chosen: {})
        nodes, written = exported(lambda: _SelfAttention(prefix='att_'), str(tmp_path / str(pair)))
        assert any(n.get('attrs', {}).get('emit_v') == '1' for n in nodes) == (
            pair and attention_pays())
        files += written
    for with_pair, without in zip(files[:2], files[2:]):
        assert with_pair['nodes'] == without['nodes'] and with_pair['heads'] == without['heads']
        assert {QK, VA} <= {n['op'] for n in with_pair['nodes']}
        assert not any(n['op'].startswith('mxmp_') for n in with_pair['nodes'])


_CHECK = """
import json
from mxmp._src.conformance.check import check_kernels
report = check_kernels('bfloat16', ops=['%s'], cases=['library'], jobs=1)
print(json.dumps([dict(r) for r in (report.rows if hasattr(report, 'rows') else report)]))
""" % VA


@needs_library
@pytest.mark.parametrize('isa', [None, 'AVX2'])
def test_check_kernels_runs_the_pair_against_float64(isa):
    """``mxmp check-kernels``' library case of selfatt_valatt has a variant that runs the pair
    (the library's emit_v/v_only ops) against the float64 references of both ops."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, OMP_NUM_THREADS='2')
    env.pop('DNNL_MAX_CPU_ISA', None)
    if isa:
        env['DNNL_MAX_CPU_ISA'] = isa
    proc = subprocess.run([sys.executable, '-c', _CHECK], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r['variant']: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    row = rows['pair heads=3 odd']
    assert row['verdict'] == 'ok', row
    assert row['detail'].startswith('the self-attention pair (selfatt_qk emit_v=1'), row
