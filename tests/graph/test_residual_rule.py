"""The pass's residual rule (mxmp/_src/graph/residual_rule.py): ``Policy(residual_dtype='target')``
holds a float32 LayerNorm's output in the target dtype for its consumers (one cast right after
the LayerNorm), so a post-LayerNorm block's residual add runs in bfloat16 (with mxmp's library
Dropout on the branch too: BERT's block); the default keeps it float32.

Checked on a post-LayerNorm block (BERT's: x -> Dense -> + x -> LayerNorm -> Dense -> + ->
LayerNorm -> Dense) and a pre-LayerNorm block (GPT's: x + Dense(LayerNorm(x))): the exact casts
of both settings, the dtype each consumer reads from the LayerNorm in the converted graph
(MXNet's type inference), values against float32, a training step, explain, remove_casts and
the export in plain MXNet.

Bounds: the converted post-LayerNorm block against float32, max |error| / max |float32 output|
over seeds 0-4 (Zen 4, real kernels; AVX2 emulation gives the same values): default
4.0e-3..5.5e-3, with the rule 3.9e-3..7.6e-3 (the two settings differ by 3.8e-3..6.9e-3);
bound 2e-2. BERT's block with Dropout (inference), kernels='auto', seeds 0-4 (real kernels
and AVX2 emulation alike): default 4.1e-3..8.3e-3, with the rule 4.1e-3..1.57e-2 (seed 0;
the settings differ by 3.5e-3..1.53e-2); the same bound. The pre-LayerNorm block's values are
the same with and without the rule (the Dense reads the same rounding): compared exactly.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxmp
from mxmp._src.graph.symbol_json import infer_dtypes, load

REL = 2e-2
SHAPE = (4, 6, 16)
WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'kernels',
                      'plain_mxnet_worker.py')


def _post_ln():
    x = mx.sym.var('data')
    h = mx.sym.FullyConnected(x, num_hidden=16, flatten=False, name='fc1')
    y = mx.sym.LayerNorm(mx.sym.elemwise_add(x, h, name='add1'), name='ln1')
    z = mx.sym.FullyConnected(y, num_hidden=16, flatten=False, name='fc2')
    out = mx.sym.LayerNorm(mx.sym.elemwise_add(y, z, name='add2'), name='ln2')
    return mx.sym.FullyConnected(out, num_hidden=4, flatten=False, name='head')


def _pre_ln():
    x = mx.sym.var('data')
    h = mx.sym.FullyConnected(mx.sym.LayerNorm(x, name='ln1'), num_hidden=16, flatten=False,
                              name='fc1')
    y = mx.sym.elemwise_add(x, h, name='add1')
    return mx.sym.FullyConnected(mx.sym.LayerNorm(y, name='ln2'), num_hidden=4, flatten=False,
                                 name='head')


def _policy(residual, kernels='mxnet'):
    return mxmp.Policy('bfloat16', residual_dtype=residual, kernels=kernels)


def _casts(sym):
    nodes = load(sym)['nodes']
    return sorted((nodes[n['inputs'][0][0]]['name'], n['attrs']['dtype'])
                  for n in nodes if n['op'] == 'amp_cast')


def _reads(sym, consumer):
    """{input node name: dtype MXNet infers there} of node ``consumer`` of ``sym``."""
    js = load(sym)
    dtypes = infer_dtypes(js, {})
    node = next(n for n in js['nodes'] if n['name'] == consumer)
    return {js['nodes'][s]['name']: dtypes[(s, i)] for s, i, _ in node['inputs']}


_PARAMS_CAST = [('data', 'bfloat16')] + [('%s_%s' % (fc, p), 'bfloat16')
                                         for fc in ('fc1', 'fc2', 'head')
                                         for p in ('weight', 'bias')]


def test_policy_field_validated_and_compared():
    assert mxmp.Policy().residual_dtype == 'target'
    with pytest.raises(ValueError, match="residual_dtype='bfloat16'.*'target'"):
        mxmp.Policy(residual_dtype='bfloat16')
    on, off = _policy('target'), _policy('float32')
    assert on != off and on == _policy('target') and hash(on) == hash(_policy('target'))
    assert off.replace(residual_dtype='target') == on


# kernels='mxnet': MXNet's float32 LayerNorm, which the rule is for. mxmp's library LayerNorm
# (kernels='auto') already returns its data's dtype: bfloat16 after a bfloat16 op
# (tests/kernels/test_bfloat16_library_ops.py).
@pytest.mark.parametrize('kernels', ['mxnet'])
def test_post_ln_casts_and_what_consumers_read(kernels):
    sym = _post_ln()
    off = mxmp.convert_symbol(sym, policy=_policy('float32', kernels))
    on = mxmp.convert_symbol(sym, policy=_policy('target', kernels))
    # default: the add after fc2 reads ln1 in float32 and fc2's output cast up
    assert _casts(off) == sorted(_PARAMS_CAST + [('fc1', 'float32'), ('ln1', 'bfloat16'),
                                                 ('fc2', 'float32'), ('ln2', 'bfloat16'),
                                                 ('head', 'float32')])
    assert sorted(_reads(off, 'add2').values()) == ['float32', 'float32']
    # the rule: ln1's output is cast once; fc2 and the add read it; the add runs in bfloat16
    # and is cast up for ln2; the same number of casts
    assert _casts(on) == sorted(_PARAMS_CAST + [('fc1', 'float32'), ('ln1', 'bfloat16'),
                                                ('add2', 'float32'), ('ln2', 'bfloat16'),
                                                ('head', 'float32')])
    assert _reads(on, 'add2') == {'ln1_residual': 'bfloat16', 'fc2': 'bfloat16'}
    assert _reads(on, 'fc2')['ln1_residual'] == 'bfloat16'
    assert _reads(on, 'ln1_residual') == {'ln1_amp_cast_bfloat16': 'bfloat16'}
    # the LayerNorms themselves still compute in float32
    assert set(_reads(on, 'ln2').values()) == {'float32'}
    assert mxmp.remove_casts(on).tojson() == mxmp.remove_casts(off).tojson()


def test_pre_ln_moves_no_value_and_keeps_graph_outputs_float32():
    sym = _pre_ln()
    off = mxmp.convert_symbol(sym, policy=_policy('float32'))
    on = mxmp.convert_symbol(sym, policy=_policy('target'))
    assert _casts(on) == _casts(off)   # the LayerNorms feed Dense only
    args = {'data': mx.nd.array(np.random.RandomState(0).normal(size=SHAPE))}
    shapes, _, _ = sym.infer_shape(data=SHAPE)
    rng = np.random.RandomState(1)
    for name, shape in zip(sym.list_arguments(), shapes):
        args.setdefault(name, mx.nd.array(rng.normal(scale=0.3, size=shape)))
    got = [s.bind(mx.cpu(), {k: v.copy() for k, v in args.items()}).forward()[0].asnumpy()
           for s in (mxmp.convert_symbol(sym, policy=_policy(r, 'mxnet').replace(emulate=True))
                     for r in ('float32', 'target'))]
    np.testing.assert_array_equal(got[0], got[1])
    # a LayerNorm that is a graph output is not rounded; its other consumers read bfloat16
    ln = mx.sym.LayerNorm(mx.sym.var('data'), name='ln')
    both = mx.sym.Group([ln, mx.sym.FullyConnected(ln, num_hidden=4, name='fc')])
    conv = load(mxmp.convert_symbol(both, policy=_policy('target')))
    assert conv['nodes'][conv['heads'][0][0]]['name'] == 'ln'
    assert _reads(mxmp.convert_symbol(both, policy=_policy('target')), 'fc')['ln_residual'] \
        == 'bfloat16'


def test_float32_consumers_and_user_classes_keep_float32():
    x = mx.sym.LayerNorm(mx.sym.var('data'), name='ln')
    sym = mx.sym.Group([mx.sym.softmax(x, name='sm'),
                        mx.sym.FullyConnected(x, num_hidden=4, name='fc')])
    on = mxmp.convert_symbol(sym, policy=_policy('target'))
    assert _reads(on, 'sm') == {'ln': 'float32'}   # softmax computes in float32
    assert _reads(on, 'fc')['ln_residual'] == 'bfloat16'
    # LayerNorm in lp_ops computes in bfloat16 already: the rule leaves it
    lp = mxmp.convert_symbol(sym, policy=_policy('target').replace(lp_ops=['LayerNorm']))
    assert not any(n['op'] == '_copy' for n in load(lp)['nodes'])


def test_explain_names_the_rule():
    rows = {r.name: r for r in mxmp.explain(_post_ln(), policy=_policy('target'))}
    assert rows['ln1_residual'].dtype == 'bfloat16'
    assert "residual_dtype='target'" in rows['ln1_residual'].rule
    assert rows['add2'].dtype == 'bfloat16'
    off = {r.name: r for r in mxmp.explain(_post_ln(), policy=_policy('float32'))}
    assert 'ln1_residual' not in off and off['add2'].dtype == 'float32'


class _PostLN(nn.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.fc1 = nn.Dense(16, flatten=False)
            self.ln1 = nn.LayerNorm()
            self.fc2 = nn.Dense(16, flatten=False)
            self.ln2 = nn.LayerNorm()
            self.head = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, x):  # noqa: N803 (Gluon's F)
        y = self.ln1(x + self.fc1(x))
        return self.head(self.ln2(y + self.fc2(y)))


def _net(seed, residual=None):
    mx.random.seed(seed)
    net = _PostLN(prefix='net_')
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros(SHAPE))
    if residual is not None:
        mxmp.convert(net, 'bfloat16', policy=_policy(residual, 'auto'))
    net.hybridize()
    return net


def _x(seed):
    return mx.nd.array(np.random.RandomState(seed).normal(size=SHAPE))


def test_values_against_float32_and_the_rule_changes_the_add():
    for seed in range(3):
        want = _net(seed)(_x(seed)).asnumpy()
        off = _net(seed, 'float32')(_x(seed)).asnumpy()
        on = _net(seed, 'target')(_x(seed)).asnumpy()
        scale = np.abs(want).max()
        assert np.abs(off - want).max() <= REL * scale
        assert np.abs(on - want).max() <= REL * scale
        assert not np.array_equal(on, off)   # the add is rounded to bfloat16


def test_training_step():
    losses = {}
    for residual in ('float32', 'target'):
        net = _net(0, residual)
        trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
        before = net.head.weight.data().asnumpy().copy()
        with autograd.record():
            loss = (net(_x(0)) ** 2).mean()
        loss.backward()
        trainer.step(1)
        grad = net.fc1.weight.grad().asnumpy()
        assert np.isfinite(grad).all() and np.abs(grad).max() > 0
        assert not np.array_equal(net.head.weight.data().asnumpy(), before)
        losses[residual] = float(loss.asscalar())
    assert abs(losses['target'] - losses['float32']) <= REL * losses['float32']


def test_export_loads_in_plain_mxnet(tmp_path):
    net = _net(0, 'target')
    want = net(_x(0)).asnumpy()
    assert any(n['op'] == '_copy' for n in load(mxmp.converted_graph(net))['nodes'])
    net.export(str(tmp_path / 'casts'), remove_amp_cast=False)
    net.export(str(tmp_path / 'plain'))
    np.save(str(tmp_path / 'x.npy'), _x(0).asnumpy())
    cases = [{'name': name, 'kind': 'imports', 'prefix': str(tmp_path / name), 'epoch': 0,
              'inputs': {'data': str(tmp_path / 'x.npy')}, 'import_mxmp': False}
             for name in ('casts', 'plain')]
    (tmp_path / 'spec.json').write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([sys.executable, WORKER, str(tmp_path / 'spec.json')],
                          capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out.pop('mxmp_imported')
    for name in ('casts', 'plain'):
        got = np.asarray(out[name]['out'])
        assert np.abs(got - want).max() <= REL * np.abs(want).max(), name
    with open(str(tmp_path / 'casts-symbol.json')) as f:   # the identity is the plan's device:
        ops = [n['op'] for n in json.load(f)['nodes']]        # the file's add reads the cast
    assert '_copy' not in ops and 'amp_cast' in ops


# kernels='mxnet': MXNet's float32 LayerNorm, which the rule is for. mxmp's library LayerNorm
# (kernels='auto') already returns its data's dtype: bfloat16 after a bfloat16 op
# (tests/kernels/test_bfloat16_library_ops.py).
@pytest.mark.parametrize('kernels', ['mxnet'])
def test_add_of_a_float32_dropout_keeps_float32(kernels):
    """BERT's residual add with MXNet's Dropout, which computes in float32: the add reads the
    float32 LayerNorm output, as by default, instead of casting the bfloat16 one back up
    (mxmp's library Dropout follows its data: test_library_dropout_branch_add_runs_in_target_dtype)."""
    x = mx.sym.var('data')
    y = mx.sym.LayerNorm(x, name='ln1')
    z = mx.sym.Dropout(mx.sym.FullyConnected(y, num_hidden=16, flatten=False, name='fc2'),
                       p=0.1, name='drop')
    sym = mx.sym.LayerNorm(mx.sym.elemwise_add(y, z, name='add2'), name='ln2')
    off = mxmp.convert_symbol(sym, policy=_policy('float32', kernels))
    on = mxmp.convert_symbol(sym, policy=_policy('target', kernels))
    assert _casts(on) == _casts(off)
    assert _reads(on, 'add2') == _reads(off, 'add2') == {'ln1': 'float32', 'drop': 'float32'}
    assert _reads(on, 'fc2')['ln1_residual'] == 'bfloat16'
    rows = {r.name: r.dtype for r in mxmp.explain(sym, policy=_policy('target', kernels))}
    assert rows['add2'] == 'float32'


def _post_ln_dropout():
    """BERT's block: y = LayerNorm(x + Dropout(Dense(x))), twice."""
    x = mx.sym.var('data')
    h = mx.sym.Dropout(mx.sym.FullyConnected(x, num_hidden=16, flatten=False, name='fc1'),
                       p=0.1, name='drop1')
    y = mx.sym.LayerNorm(mx.sym.elemwise_add(x, h, name='add1'), name='ln1')
    z = mx.sym.Dropout(mx.sym.FullyConnected(y, num_hidden=16, flatten=False, name='fc2'),
                       p=0.1, name='drop2')
    out = mx.sym.LayerNorm(mx.sym.elemwise_add(y, z, name='add2'), name='ln2')
    return mx.sym.FullyConnected(out, num_hidden=4, flatten=False, name='head')


def test_library_dropout_branch_add_runs_in_target_dtype():
    """kernels='auto': the library's Dropout and LayerNorm follow their data, so with the rule
    the residual add reads ln1's bfloat16 copy and the bfloat16 Dropout, runs in bfloat16, and
    the next LayerNorm takes bfloat16 data (statistics in float32 inside the kernel); by
    default the add casts the Dropout up and runs in float32."""
    sym = _post_ln_dropout()
    off = mxmp.convert_symbol(sym, policy=_policy('float32', 'auto'))
    on = mxmp.convert_symbol(sym, policy=_policy('target', 'auto'))
    assert _reads(off, 'add2') == {'ln1': 'float32', 'drop2_amp_cast_float32': 'float32'}
    assert _reads(on, 'add2') == {'ln1_residual': 'bfloat16', 'drop2': 'bfloat16'}
    assert _reads(on, 'ln2')['add2'] == 'bfloat16'
    assert _reads(on, 'head')['ln2_residual'] == 'bfloat16'
    # by default drop2 is cast up for add2 and ln2 down for head; with the rule ln1's output
    # is cast down once (as by default) and neither of the two is left. (The kernel rule's
    # shape tie of ln2's gamma and beta, arange_like of its data, follows the data: a (16,)
    # vector cast up.)
    up_down = [('drop2', 'float32'), ('ln2', 'bfloat16')]
    assert _casts(on) == sorted([c for c in _casts(off) if c not in up_down] +
                                [('ln2_mxmp_last_axis', 'float32')])
    assert set(up_down) <= set(_casts(off)) and ('ln1', 'bfloat16') in _casts(on)
    rows = {r.name: r.dtype for r in mxmp.explain(sym, policy=_policy('target', 'auto'))}
    assert rows['add2'] == 'bfloat16' and rows['ln1_residual'] == 'bfloat16'


def test_binary_broadcast_consumer_keeps_float32():
    """MXNet 1.9.1's bfloat16 broadcast_add is a scalar loop (about 200x elemwise_add's time
    at BERT's sizes): a broadcast consumer of the LayerNorm keeps reading its float32 output
    (without the exclusion it read the bfloat16 copy and ran in bfloat16)."""
    y = mx.sym.LayerNorm(mx.sym.var('data'), name='ln')
    z = mx.sym.FullyConnected(y, num_hidden=16, flatten=False, name='fc')
    sym = mx.sym.broadcast_add(y, z, name='badd')
    on = mxmp.convert_symbol(sym, policy=_policy('target'))
    assert _reads(on, 'badd') == {'ln': 'float32', 'fc_amp_cast_float32': 'float32'}
    assert _reads(on, 'fc')['ln_residual'] == 'bfloat16'


def test_dropout_block_values_against_float32():
    """The post-LayerNorm block with Dropout (inference: identity), kernels='auto', against
    float32 MXNet (emulated where the CPU has no bfloat16 kernels); the rule changes the
    values (the add rounds to bfloat16) within the same bound."""
    sym = _post_ln_dropout()
    shapes, _, _ = sym.infer_shape(data=SHAPE)
    for seed in range(3):
        rng = np.random.RandomState(seed)
        args = {name: mx.nd.array(rng.normal(scale=0.3 if name != 'data' else 1.0, size=shape))
                for name, shape in zip(sym.list_arguments(), shapes)}
        want = sym.bind(mx.cpu(), args).forward()[0].asnumpy()
        got = {r: mxmp.convert_symbol(sym, policy=_policy(r, 'auto').replace(
            emulate=not mxmp.lp_kernels_available('bfloat16'))).bind(
            mx.cpu(), {k: v.copy() for k, v in args.items()}).forward()[0].asnumpy()
            for r in ('float32', 'target')}
        scale = np.abs(want).max()
        for r in got:
            assert np.abs(got[r] - want).max() <= REL * scale, (seed, r)
        assert not np.array_equal(got['target'], got['float32'])


@pytest.mark.parametrize('policy', [
    # amp.init's own policy (contrib.amp's follow_params) with the rule: ln2 reads bfloat16
    mxmp.Policy('bfloat16', residual_dtype='target', follow_params=True),
    'bfloat16',   # no rule: a LayerNorm right after a Dense reads bfloat16 too
], ids=['residual-target', 'lnafterdense'])
def test_amp_keeps_library_layernorm_parameters_float32(policy):
    """Under mxmp.amp.init (follow_params) a library LayerNorm fed bfloat16 data stored its
    gamma and beta in bfloat16 (its shape-tie input copies took the data's dtype): gluon.Trainer
    then updated bfloat16 weights and GluonNLP's clip_grad_global_norm (multi_sum_sq) refused
    the mixed gradients. gamma and beta stay float32 master parameters; the gradients match
    the float32 network's."""
    from mxmp import amp
    mx.random.seed(0)
    if policy == 'bfloat16':
        net = nn.HybridSequential()
        with net.name_scope():
            net.add(nn.Dense(16, flatten=False, in_units=16), nn.LayerNorm(in_channels=16),
                    nn.Dense(4, flatten=False, in_units=16))
    else:
        net = _PostLN(prefix='net_')
    net.initialize(mx.init.Xavier())
    x = _x(0)
    with autograd.record():
        ref = (net(x) ** 2).mean()
    ref.backward()
    ref_grads = {p.name: p.grad().asnumpy().copy() for p in net.collect_params().values()}
    amp.init(policy)
    try:
        net.hybridize()
        with autograd.record():
            loss = (net(x) ** 2).mean()
        loss.backward()
    finally:
        amp.disable()
    params = list(net.collect_params().values())
    assert [(p.name, p.data().dtype, p.grad().dtype) for p in params] == \
        [(p.name, np.float32, np.float32) for p in params]
    grads = [p.grad() for p in params]
    total = float(mx.nd.multi_sum_sq(*grads, num_arrays=len(grads)).sum().asscalar())
    assert np.isfinite(total) and total > 0
    for p in params:
        want = ref_grads[p.name]
        assert np.abs(p.grad().asnumpy() - want).max() <= 0.1 * np.abs(want).max() + 1e-6, p.name
