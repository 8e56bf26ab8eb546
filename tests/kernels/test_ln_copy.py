"""The kernel rule's LayerNorm copy: where a library LayerNorm's output is read by exactly two
node inputs, ``mxmp_layer_norm`` (``copy_out=1``) also outputs a copy that the second reader
reads, and its backward sums the two gradients, so that MXNet no longer sums them with
``add_n`` (whose bfloat16 kernel converts element by element).

The same numbers: the worker compares bits against the op without the copy fed MXNet's
``add_n`` (float32, bfloat16, float64; odd sizes, NaN and inf; native and under
``DNNL_MAX_CPU_ISA=AVX2``), and bert_tiny's losses and parameters after 3 SGD steps against
the rule's graph without the copy.
"""
import json

import numpy as np
import pytest

import mxnet as mx
import mxmp
from mxmp._src.graph import ln_copy
from mxmp._src.graph.kernel_rule import apply_kernels
from mxmp._src.graph.kernel_undo import mxnet_ops
from mxmp._src.graph.rule_notes import kernel_rule_of as rule_of
from mxmp._src.graph.strip import strip
from mxmp._src.graph.symbol_json import dump, load
from tier_run import exported, needs_library, run_on_tier, run_on_tiers



@pytest.fixture(scope='module')
def runs():
    return run_on_tiers('ln_copy_worker.py')


@needs_library
@pytest.mark.parametrize('tier', ['native', 'AVX2'])
def test_copy_computes_the_layer_norm_numbers_bit_for_bit(runs, tier):
    run = runs[tier]
    assert len(run['rows']) == 18   # 3 shapes x finite/NaN-inf x float32/bfloat16/float64
    for row in run['rows']:
        assert row['dtypes'] == [row['dtype']] * 2, row   # out and its copy in data's dtype
        for key in ('y', 'copy', 'dx', 'dgamma', 'dbeta'):
            assert row[key] == {'bits': True, 'nan': True}, (key, row)
    assert run['unread'] == {'bits': True, 'nan': True}   # the copy's zero gradient


def _block(x, readers=2, head=False, mean=False):
    """LayerNorm ``ln`` of ``x`` read by a FullyConnected and ``readers - 1`` adds."""
    ln = mx.sym.LayerNorm(x, name='ln', output_mean_var=mean)
    y = ln[0] if mean else ln
    fc = mx.sym.FullyConnected(y, num_hidden=8, flatten=False, name='fc')
    outs = [mx.sym.elemwise_add(fc, y, name='add%d' % k) for k in range(1, readers)]
    outs = outs or [fc]
    if head:
        outs.append(y)
    if mean:
        outs.append(mx.sym.sum(ln[1], name='mean_sum'))
    return mx.sym.Group(outs) if len(outs) > 1 else outs[0]


def _by_name(js):
    return {n['name']: (i, n) for i, n in enumerate(js['nodes'])}


@needs_library
@pytest.mark.parametrize('data', ['variable', 'op'])
def test_rule_rewires_the_second_reader_and_mxnet_ops_undoes_it(data):
    x = mx.sym.var('data')
    if data == 'op':   # the LayerNorm's data from an op (bfloat16 in a converted graph)
        x = mx.sym.FullyConnected(x, num_hidden=8, flatten=False, name='proj')
    sym = _block(x)
    lib = apply_kernels(load(sym), 'auto')
    nodes = _by_name(lib)
    ln_id, ln = nodes['ln']
    assert (ln['op'], ln['attrs']['copy_out']) == ('mxmp_layer_norm', '1')
    assert nodes['fc'][1]['inputs'][0] == [ln_id, 0, 0]      # the first reader: out
    assert nodes['add1'][1]['inputs'][1] == [ln_id, 3, 0]    # the second: the copy
    assert 'copy_out=1' in rule_of(ln)
    assert dump(lib).infer_shape(data=(2, 3, 8))[1] == [(2, 3, 8)]
    for back in (mxnet_ops(lib), strip(lib)):   # files; remove_casts: the graph before
        assert back['nodes'] == load(sym)['nodes'] and back['heads'] == load(sym)['heads']


@needs_library
@pytest.mark.parametrize('case', ['three readers', 'graph output', 'mean read', 'one reader'])
def test_rule_keeps_one_output_otherwise(case):
    x = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8, flatten=False, name='proj')
    sym = {'three readers': lambda: _block(x, readers=3),
           'graph output': lambda: _block(x, head=True),
           'mean read': lambda: _block(x, mean=True),
           'one reader': lambda: _block(x, readers=1)}[case]()
    lib = apply_kernels(load(sym), 'auto')
    assert not any(n.get('attrs', {}).get('copy_out') for n in lib['nodes']), case
    assert not any(i == 3 for n in lib['nodes'] for _, i, _ in n['inputs']), case
    if case != 'mean read':   # (mean read: MXNet's LayerNorm stays)
        assert 'mxmp_layer_norm' in {n['op'] for n in lib['nodes']}


def _converted_nodes(sym):
    conv = mxmp.convert_symbol(sym, 'bfloat16')
    return json.loads(conv.tojson(remove_amp_cast=False))['nodes']


@needs_library
def test_conversion_and_explain_agree_where_the_copy_stays():
    # data from a low-precision op: the LayerNorm runs in bfloat16 and keeps the copy
    sym = _block(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8, flatten=False,
                                       name='proj'))
    nodes = _converted_nodes(sym)
    ln = [n for n in nodes if n['op'] == 'mxmp_layer_norm']
    assert [n.get('attrs', {}).get('copy_out') for n in ln] == ['1']
    rows = {r.name: r for r in mxmp.explain(sym, 'bfloat16')}
    assert 'LayerNorm copy for add1: copy_out=1' in rows['ln'].rule, rows['ln']
    assert "it reads ln's output copy" in rows['add1'].rule, rows['add1']
    rows = {r.name: r for r in mxmp.explain(sym, policy=mxmp.Policy('bfloat16',
                                                                    kernels='mxnet'))}
    assert 'copy' not in rows['ln'].rule


@needs_library
def test_a_float32_layer_norm_cast_for_both_readers_keeps_no_copy():
    """float32 data: the LayerNorm runs in float32 and the residual rule casts its output for
    both readers; two casts would sum the gradients in float32 where the one cast's add_n sums
    them in bfloat16: the conversion takes the copy back (drop_cast_copies), explain says so."""
    sym = _block(mx.sym.var('data'))
    nodes = _converted_nodes(sym)
    assert [n['op'] for n in nodes].count('mxmp_layer_norm') == 1
    assert not any(n.get('attrs', {}).get('copy_out') for n in nodes)
    casts_of_ln = [n for n in nodes if n['op'] == 'amp_cast' and
                   nodes[n['inputs'][0][0]]['op'] == 'mxmp_layer_norm']
    assert len(casts_of_ln) == 1   # one cast, read by both (through the residual identity)
    rows = {r.name: r for r in mxmp.explain(sym, 'bfloat16')}
    assert 'copy' not in rows['ln'].rule and 'copy' not in rows['add1'].rule


@needs_library
def test_emulation_keeps_no_copy():
    """Emulated bfloat16 (float32 kernels): the sum is float32 anyway, and the copy would get
    its own rounding nodes (more sums than it saves: 118 -> 127 add_n calls on bert_tiny): the
    conversion takes every copy back; the real graph keeps it."""
    sym = _block(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8, flatten=False,
                                       name='proj'))
    for emulate, copies in ((True, [None]), (False, ['1'])):
        conv = mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', emulate=emulate))
        nodes = json.loads(conv.tojson(remove_amp_cast=False))['nodes']
        assert [n.get('attrs', {}).get('copy_out') for n in nodes
                if n['op'] == 'mxmp_layer_norm'] == copies, emulate
        reads_copy = any(i == 3 and nodes[s]['op'] == 'mxmp_layer_norm'
                         for n in nodes for s, i, _ in n['inputs'])
        assert reads_copy == (not emulate), emulate


@needs_library
@pytest.mark.parametrize('value, message', [
    ('2', "copy_out must be 0 or 1, got '2'"), ('yes', "copy_out must be 0 or 1, got 'yes'")])
def test_bad_copy_out_is_a_clear_error(value, message):
    with pytest.raises(mx.base.MXNetError) as err:
        out = mx.nd.mxmp_layer_norm(mx.nd.zeros((2, 4)), mx.nd.ones((4,)), mx.nd.zeros((4,)),
                                    copy_out=value)
        out[0].wait_to_read()
    assert message in str(err.value)


@needs_library
@pytest.mark.real_kernels
def test_bert_tiny_trains_bit_for_bit_without_the_layer_norm_sums():
    """bert_tiny (2 layers) converted to bfloat16, 3 SGD steps with and without the copy."""
    pytest.importorskip('gluonnlp', reason="the BERT models need the optional extra: pip "
                                           "install -e '.[bert]'")
    run = run_on_tier('ln_copy_bert_worker.py', None)
    copy, no_copy = run['copy'], run['no_copy']
    # 5 LayerNorms: the embeddings' (float32, cast for both readers: no copy), 3 read by a
    # FullyConnected and a residual add (the copy), the last read once
    assert copy['layer_norms'] == no_copy['layer_norms'] == 5
    assert len(copy['copy_out']) == 3 and no_copy['copy_out'] == []
    assert no_copy['add_n_calls'] - copy['add_n_calls'] == 3, run
    assert copy['losses'] == no_copy['losses']   # float32 bits of each step's losses
    assert copy['params'] == no_copy['params']   # md5 of every parameter after 3 steps


@needs_library
@pytest.mark.parametrize('data', ['variable', 'op'])
def test_inference_only_graphs_drop_the_copy_with_the_same_outputs(data):
    """A graph that only runs inference (the fused twin, mxmp.freeze) has no backward to sum
    the two gradients: the copy goes and its reader reads output 0; the outputs keep their
    bits."""
    from mxmp._src.graph.kernel_undo import inference_only
    x = mx.sym.var('data')
    if data == 'op':
        x = mx.sym.FullyConnected(x, num_hidden=8, flatten=False, name='proj')
    lib = apply_kernels(load(_block(x)), 'auto')
    assert any(ln_copy.has_copy(n) for n in lib['nodes'])
    back = inference_only(lib)
    nodes = _by_name(back)
    ln_id, ln = nodes['ln']
    assert ln['op'] == 'mxmp_layer_norm' and 'copy_out' not in ln['attrs']
    assert nodes['add1'][1]['inputs'][1] == [ln_id, 0, 0]
    assert not any(i == 3 for n in back['nodes'] for _, i, _ in n['inputs'])
    rng = np.random.RandomState(0)
    shapes = dict(zip(dump(lib).list_arguments(), dump(lib).infer_shape(data=(2, 3, 8))[0]))
    args = {k: mx.nd.array(rng.normal(size=v)) for k, v in shapes.items()}
    got = [dump(g).eval(mx.cpu(), **args)[0].asnumpy() for g in (lib, back)]
    assert got[0].tobytes() == got[1].tobytes()


class _Residual(mx.gluon.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.proj = mx.gluon.nn.Dense(16, flatten=False, prefix='proj_')
            self.norm = mx.gluon.nn.LayerNorm(prefix='norm_')
            self.ffn = mx.gluon.nn.Dense(16, flatten=False, prefix='ffn_')

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's F)
        y = self.norm(self.proj(x))
        return self.ffn(y) + y


@needs_library
@pytest.mark.real_kernels
def test_export_holds_the_graph_without_the_copy(tmp_path, monkeypatch):
    files = []
    for copy in (True, False):
        if not copy:
            monkeypatch.setattr(ln_copy, 'layer_norm_copies', lambda js, chosen: {})
        nodes, written = exported(lambda: _Residual(prefix='res_'), str(tmp_path / str(copy)))
        assert any(n.get('attrs', {}).get('copy_out') == '1' for n in nodes) == copy
        files += written
    for with_copy, without in zip(files[:2], files[2:]):
        assert with_copy['nodes'] == without['nodes'] and with_copy['heads'] == without['heads']
        assert 'LayerNorm' in {n['op'] for n in with_copy['nodes']}
        assert not any(n['op'].startswith('mxmp_') for n in with_copy['nodes'])


_CHECK = """
import json
from mxmp._src.conformance.check import check_kernels
report = check_kernels('bfloat16', ops=['LayerNorm'], cases=['library'], jobs=1)
print(json.dumps([dict(r) for r in (report.rows if hasattr(report, 'rows') else report)]))
"""


@needs_library
@pytest.mark.parametrize('isa', [None, 'AVX2'])
def test_check_kernels_runs_the_copy_against_mxnet(isa):
    """``mxmp check-kernels``' library case of LayerNorm has a variant that runs the copy (two
    readers of the output) against MXNet's LayerNorm, and its bits against the op without it."""
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
    row = rows['copy odd']
    assert row['verdict'] == 'ok', row
    assert row['detail'].startswith('the LayerNorm copy (copy_out=1, two readers)'), row
