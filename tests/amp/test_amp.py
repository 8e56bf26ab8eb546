"""mxmp.amp: contrib.amp's API on mxmp (same names and signatures; init is a process-wide switch
that hooks Gluon's graph building, not MXNet's operators)."""
import inspect
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.contrib import amp as contrib_amp
from mxnet.contrib.amp.amp import bfloat16
from mxnet.gluon import nn

import mxmp
from mxmp import amp
from mxmp._src.dtypes import dtype_name

NAMES = ['init', 'init_trainer', 'scale_loss', 'unscale', 'convert_symbol', 'convert_model',
         'convert_hybrid_block', 'list_lp16_ops', 'list_fp32_ops', 'list_widest_type_cast',
         'list_conditional_fp32_ops', 'list_loss_output_functions']


@pytest.fixture(autouse=True)
def fresh_amp():
    amp.disable()                # the switch and the recorded defaults, off between tests
    yield
    amp.disable()


def problem(n=64, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(n, 10)).astype(np.float32)
    w = rng.normal(size=(10, 4))
    return mx.nd.array(x), mx.nd.array((x @ w).argmax(axis=1))


def mlp(seed=0):
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(32, in_units=10, activation='relu'), nn.Dense(4, in_units=32))
    net.initialize(mx.init.Xavier())
    return net


def amp_step(net, trainer, x, y, scale_by=1.0):
    """One iteration as contrib.amp's users write it: forward, scale_loss, backward, step;
    returns the mean loss (``scale_by`` multiplies the loss, e.g. inf)."""
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y) * scale_by
        with amp.scale_loss(loss, trainer) as scaled_loss:
            autograd.backward(scaled_loss)
    trainer.step(x.shape[0])
    return float(loss.mean().asscalar())


@pytest.mark.parametrize('name', NAMES)
def test_names_and_parameters_match_contrib_amp(name):
    ours = list(inspect.signature(getattr(amp, name)).parameters)
    theirs = list(inspect.signature(getattr(contrib_amp, name)).parameters)
    assert ours == theirs


def graph_policy(net):
    return mxmp._src.gluon._BUILT[net].policy


def test_contrib_style_training_loop_trains_in_bfloat16_with_no_convert_call():
    """contrib.amp's documented Gluon recipe (init, init_trainer, scale_loss), mxmp.amp names."""
    x, y = problem()
    reference = mlp()(x).asnumpy()
    amp.init(target_dtype='bfloat16')
    net = mlp()
    net.hybridize()
    out = net(x).asnumpy()
    # emulation is chosen from the hardware: on for CPUs without oneDNN bfloat16 kernels
    assert graph_policy(net).target_dtype == 'bfloat16'
    assert graph_policy(net).emulate == (not mxmp.lp_kernels_available('bfloat16'))
    # bfloat16 casts, or (emulated) mxmp's bfloat16 rounding nodes
    assert mxmp._src.graph.strip.converted_dtype(mxmp.converted_graph(net)) == 'bfloat16'
    assert out.dtype == np.float32
    assert not np.array_equal(out, reference)                  # bfloat16 numerics ...
    np.testing.assert_allclose(out, reference, rtol=0.05, atol=0.05)   # ... close to float32

    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5})
    amp.init_trainer(trainer)
    losses = [amp_step(net, trainer, x, y) for _ in range(25)]
    assert losses[-1] < 0.5 * losses[0]
    assert trainer._amp_loss_scaler.loss_scale == 1.0          # no scaling for bfloat16
    assert trainer._amp_loss_scaler.skipped_steps == 0


def test_bfloat16_weights_train_with_mxmp_trainer():
    """cast_optional_params=True stores bfloat16 weights; mxmp.Trainer keeps float32 masters."""
    x, y = problem(seed=1)
    amp.init('bfloat16')
    net = amp.convert_hybrid_block(mlp(1), cast_optional_params=True)
    weights = [p for p in net.collect_params().values() if p.name.endswith('weight')]
    assert all(mxmp._src.dtypes.dtype_name(p.dtype) == 'bfloat16' for p in weights)
    trainer = mxmp.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.5})
    amp.init_trainer(trainer)                 # nothing to do for mxmp.Trainer
    losses = [amp_step(net, trainer, x, y) for _ in range(20)]
    assert losses[-1] < 0.6 * losses[0]


def test_float16_gluon_trainer_skips_an_overflowing_step_and_halves_the_scale():
    x, y = problem(seed=2)
    amp.init('float16')
    net = amp.convert_hybrid_block(mlp(2))
    net(x)
    assert graph_policy(net).emulate                     # float16 has no CPU kernels
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    amp.init_trainer(trainer)
    scaler = trainer._amp_loss_scaler
    assert scaler.loss_scale == 2.0 ** 16
    params = list(net.collect_params().values())
    before = [p.data().asnumpy().copy() for p in params]

    amp_step(net, trainer, x, y, scale_by=float('inf'))   # every gradient inf/NaN
    assert scaler.skipped_steps == 1 and scaler.loss_scale == 2.0 ** 15
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.data().asnumpy(), b)

    # Sum-of-batch gradients x 2**15 still overflow float16 here: the scaler keeps halving
    # and skipping until a step fits, then that step updates the weights.
    scales = []
    for _ in range(12):
        skipped = scaler.skipped_steps
        amp_step(net, trainer, x, y)
        scales.append(scaler.loss_scale)
        if scaler.skipped_steps == skipped:
            break
    assert scaler.skipped_steps == len(scales)           # 1 (inf) + the overflowing ones
    n = len(scales)
    assert scales == [2.0 ** (15 - k) for k in range(1, n)] + [2.0 ** (15 - (n - 1))]
    assert any(not np.array_equal(p.data().asnumpy(), b) for p, b in zip(params, before))


def test_unscale_gives_the_float32_gradients():
    x, y = problem(seed=3)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    ref_net = mlp(3)
    with autograd.record():
        loss_fn(ref_net(x), y).mean().backward()
    ref = [p.grad().asnumpy() for p in ref_net.collect_params().values()]

    amp.init('float16')
    net = amp.convert_hybrid_block(mlp(3))
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    amp.init_trainer(trainer)
    with autograd.record():
        loss = loss_fn(net(x), y).mean()       # mean: x 2**16 stays inside float16
        with amp.scale_loss(loss, trainer) as scaled_loss:
            autograd.backward(scaled_loss)
    scaled = [p.grad().asnumpy().copy() for p in net.collect_params().values()]
    amp.unscale(trainer)
    assert trainer._scale == trainer._amp_original_scale
    for g, s, r in zip((p.grad().asnumpy() for p in net.collect_params().values()), scaled, ref):
        np.testing.assert_allclose(g, s / 2.0 ** 16, rtol=1e-6)
        np.testing.assert_allclose(g, r, rtol=0.05, atol=1e-3)   # float16-emulated gradients


def test_init_patches_no_operator_and_sets_the_convert_default():
    before = (mx.nd.FullyConnected, mx.sym.FullyConnected, mx.nd.SoftmaxOutput,
              gluon.Trainer._update)
    amp.init('bfloat16', target_precision_ops=['dot'], fp32_ops=['tanh'])
    assert (mx.nd.FullyConnected, mx.sym.FullyConnected, mx.nd.SoftmaxOutput,
            gluon.Trainer._update) == before
    sym = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    out = amp.convert_symbol(sym)           # target dtype from init()
    dtypes = {n['attrs']['dtype'] for n in json.loads(out.tojson(remove_amp_cast=False))['nodes']
              if n['op'] == 'amp_cast'}
    assert 'bfloat16' in dtypes
    assert 'float16' not in dtypes


def test_conditional_fp32_ops_keep_matching_nodes_in_float32():
    data = mx.sym.var('data')
    fc1 = mx.sym.FullyConnected(data, num_hidden=8, name='fc1')
    act = mx.sym.Activation(fc1, act_type='tanh', name='act')
    sym = mx.sym.FullyConnected(act, num_hidden=4, name='fc2')

    def act_input(converted):
        nodes = json.loads(converted.tojson(remove_amp_cast=False))['nodes']
        node = next(n for n in nodes if n['name'] == 'act')
        return nodes[node['inputs'][0][0]]

    plain = act_input(amp.convert_symbol(sym, 'float16'))
    assert plain['name'] == 'fc1'                          # tanh follows fc1 in float16
    cond = act_input(amp.convert_symbol(sym, 'float16',
                                        conditional_fp32_ops=[('Activation', 'act_type',
                                                               ['tanh'])]))
    assert cond['op'] == 'amp_cast' and cond['attrs']['dtype'] == 'float32'
    excl = act_input(amp.convert_symbol(sym, 'float16', excluded_sym_names=['act']))
    assert excl['op'] == 'amp_cast' and excl['attrs']['dtype'] == 'float32'


def test_convert_model_casts_parameters_and_leaves_the_inputs_alone():
    sym = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    args = {'fc_weight': mx.nd.ones((4, 3)) * 1.001, 'fc_bias': mx.nd.zeros((4,))}
    out_sym, out_args, out_aux = amp.convert_model(sym, args, {}, target_dtype='bfloat16',
                                                   cast_optional_params=True)
    assert mxmp._src.dtypes.dtype_name(out_args['fc_weight'].dtype) == 'bfloat16'
    assert np.dtype(args['fc_weight'].dtype) == np.float32          # input dict untouched
    assert out_aux == {}
    assert 'data' in out_sym.list_inputs()
    _, plain_args, _ = amp.convert_model(sym, args, {}, target_dtype='bfloat16')
    assert np.dtype(plain_args['fc_weight'].dtype) == np.float32


@pytest.mark.parametrize('dtype', ['float16', np.float16, 'bfloat16', bfloat16])
def test_op_lists(dtype):
    lp = amp.list_lp16_ops(dtype)
    assert {'Convolution', 'FullyConnected'} <= set(lp)
    assert 'softmax' in amp.list_fp32_ops(dtype)
    assert 'SoftmaxOutput' in amp.list_loss_output_functions(dtype)
    assert 'elemwise_add' in amp.list_widest_type_cast(dtype)
    cond = amp.list_conditional_fp32_ops(dtype)
    assert any(op == 'Activation' and attr == 'act_type' and 'softrelu' in values
               for op, attr, values in cond)
    assert not set(lp) & set(amp.list_fp32_ops(dtype))


def test_misuse_raises_clear_errors():
    net = mlp()
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    with pytest.raises(RuntimeError, match='init_trainer'):
        with amp.scale_loss(mx.nd.ones((1,)), trainer):
            pass
    with pytest.raises(TypeError, match='Optimizer'):
        amp.init_trainer(mx.optimizer.SGD())
    with pytest.raises(ValueError, match='float16'):
        amp.init('int8')
    kv_trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                               update_on_kvstore=True)
    with pytest.raises(ValueError, match='update_on_kvstore'):
        amp.init_trainer(kv_trainer)


# ------------------------------------------------------------------ contrib.amp's list semantics
def ops_and_casts(sym):
    """[(op, name, [input names])] of a converted graph, casts included."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    return [(n['op'], n['name'], [nodes[i]['name'] for i, _, _ in n['inputs']])
            for n in nodes if n['op'] != 'null']


def cast_dtypes_into(sym, name):
    """dtypes of the amp_cast nodes feeding node ``name`` directly."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    node = next(n for n in nodes if n['name'] == name)
    return sorted(nodes[i]['attrs']['dtype'] for i, _, _ in node['inputs']
                  if nodes[i]['op'] == 'amp_cast')


@pytest.mark.parametrize('dtype,short,lp_name', [('float16', 'fp16', 'FP16'),
                                                 ('bfloat16', 'bf16', 'BF16')])
def test_lists_modules_have_contrib_names_and_mxmp_membership(dtype, short, lp_name):
    module = getattr(amp.lists, 'symbol_' + short)
    classes = mxmp._src.policy.tables.classes_for(dtype)
    lp = getattr(module, lp_name + '_FUNCS')
    follow = getattr(module, lp_name + '_FP32_FUNCS')
    conditional = {op for op, _, _ in module.CONDITIONAL_FP32_FUNCS}
    assert set(lp) == set(classes['LOW_PRECISION']) - conditional
    assert set(follow) == set(classes['FOLLOW']) - conditional
    assert set(module.FP32_FUNCS) == (set(classes['FLOAT32']) |
                                      set(classes['LOSS_OUTPUT'])) - conditional
    assert set(module.LOSS_OUTPUT_FUNCTIONS) == set(classes['LOSS_OUTPUT'])
    assert set(module.LOSS_OUTPUT_FUNCTIONS) <= set(module.FP32_FUNCS)   # as in contrib.amp
    assert set(module.WIDEST_TYPE_CASTS) == set(classes['WIDEST_TYPE']) - conditional
    # the functions return the modules' lists
    assert amp.list_lp16_ops(dtype) == lp
    assert amp.list_lp16_fp32_ops(dtype) == follow
    assert amp.list_conditional_fp32_ops(dtype) == module.CONDITIONAL_FP32_FUNCS


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_every_op_is_in_exactly_one_list(dtype):
    everything = (amp.list_lp16_ops(dtype) + amp.list_lp16_fp32_ops(dtype) +
                  amp.list_fp32_ops(dtype) + amp.list_widest_type_cast(dtype) +
                  [op for op, _, _ in amp.list_conditional_fp32_ops(dtype)])
    repeated = sorted({op for op in everything if everything.count(op) > 1})
    assert repeated == []
    # Activation has a conditional rule (softrelu -> float32): listed there only
    assert 'Activation' not in amp.list_lp16_fp32_ops(dtype)
    assert 'Activation' in [op for op, _, _ in amp.list_conditional_fp32_ops(dtype)]
    registered = {op for op in mx.operator.get_all_registered_operators()
                  if mxmp._src.policy.tables.excluded_reason(op) is None}
    assert registered - set(everything) == set()


def two_branch_graph():
    """FullyConnected(x, y) + sin(y): one op of each kind and a widest-type add."""
    x, y = mx.sym.var('x'), mx.sym.var('y')
    fc = mx.sym.FullyConnected(x, y, num_hidden=6, no_bias=True, name='fc')
    return mx.sym.elemwise_add(fc, mx.sym.sin(y, name='sin'), name='add')


@pytest.mark.parametrize('lists', [
    dict(target_dtype_ops=['FullyConnected'], fp32_ops=['FullyConnected']),
    dict(target_dtype_ops=['FullyConnected'], fp32_ops=['Activation'],
         conditional_fp32_ops=[('Activation', 'act_type', ['selu'])]),
    dict(target_dtype_ops=['Activation'], fp32_ops=['sin']),   # default conditional: Activation
    dict(fp32_ops=['FullyConnected']),                          # default target list has it
])
def test_an_op_in_two_lists_is_a_conflict_for_both_error_styles(lists):
    with pytest.raises(amp.AmpListConflict) as info:
        amp.convert_symbol(two_branch_graph(), 'bfloat16', **lists)
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)
    conflicting = set(lists.get('target_dtype_ops', ['FullyConnected'])) & (
        set(lists.get('fp32_ops', ())) | {'Activation'})
    assert all(op in str(info.value) for op in conflicting)
    assert 'two or more lists' in str(info.value)


def test_a_widest_type_op_cannot_be_listed():
    for kwargs in (dict(fp32_ops=['elemwise_add']), dict(target_dtype_ops=['elemwise_add'])):
        with pytest.raises(AssertionError, match='elemwise_add.*widest'):
            amp.convert_symbol(two_branch_graph(), 'bfloat16', **kwargs)
    with pytest.raises(ValueError, match='no op named Convolutoin'):
        amp.convert_symbol(two_branch_graph(), 'bfloat16', target_dtype_ops=['Convolutoin'])


def test_native_policy_conflict_is_the_same_class():
    with pytest.raises(mxmp.AmpListConflict, match='lp_ops and fp32_ops: FullyConnected'):
        mxmp.Policy('bfloat16', lp_ops=['FullyConnected'], fp32_ops=['FullyConnected'])


def test_given_lists_replace_the_defaults():
    sym = two_branch_graph()
    out = amp.convert_symbol(sym, 'bfloat16', target_dtype_ops=['FullyConnected'],
                             fp32_ops=['sin'])
    # x and y go to bfloat16 for the FullyConnected, whose output goes back to float32 for
    # the add; sin reads the float32 y directly.
    assert sorted(ops_and_casts(out)) == sorted([
        ('amp_cast', 'x_amp_cast_bfloat16', ['x']),
        ('amp_cast', 'y_amp_cast_bfloat16', ['y']),
        ('FullyConnected', 'fc', ['x_amp_cast_bfloat16', 'y_amp_cast_bfloat16']),
        ('sin', 'sin', ['y']),
        ('amp_cast', 'fc_amp_cast_float32', ['fc']),
        ('elemwise_add', 'add', ['fc_amp_cast_float32', 'sin'])])
    # An empty target list: FullyConnected is in no list, it follows its float32 inputs.
    fc = mx.sym.FullyConnected(mx.sym.var('x'), mx.sym.var('y'), num_hidden=6, no_bias=True,
                               name='fc')
    untouched = amp.convert_symbol(fc, 'bfloat16', target_dtype_ops=[], fp32_ops=['sin'])
    assert mxmp.count_casts(untouched) == {'amp_cast': 0, 'amp_multicast': 0}
    assert mxmp.remove_casts(untouched).tojson() == fc.tojson()


def test_given_conditional_rules_replace_the_default_rules():
    data = mx.sym.var('data')
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name='conv')
    act = mx.sym.Activation(conv, act_type='softrelu', name='act')
    sym = mx.sym.FullyConnected(act, num_hidden=3, name='fc')
    # default rule: softrelu computes in float32
    assert cast_dtypes_into(amp.convert_symbol(sym, 'bfloat16'), 'act') == ['float32']
    # an empty list of rules replaces it: softrelu follows the bfloat16 convolution
    assert cast_dtypes_into(amp.convert_symbol(sym, 'bfloat16', conditional_fp32_ops=[]),
                            'act') == []
    # a rule on another op, only its matching nodes go to float32
    fc_rule = [('FullyConnected', 'no_bias', ['True'])]
    plain = mx.sym.FullyConnected(data, num_hidden=3, no_bias=False, name='plain')
    nobias = mx.sym.FullyConnected(data, num_hidden=3, no_bias=True, name='nobias')
    for node, expect in ((plain, None), (nobias, 'float32')):
        rows = {r.name: r for r in mxmp.explain(node, policy=amp._policy(
            'bfloat16', [], None, fc_rule, None))}
        if expect is None:
            assert rows[node.name].rule == 'follow_ops (user override)'
        else:
            assert rows[node.name].rule.startswith('conditional float32')


def test_cast_optional_params_follows_contrib_amp():
    """False: parameters feeding low-precision ops stay float32 (the graph casts them);
    True: they are stored in the target dtype. Either way convert_model's parameters have the
    dtypes the graph declares, so mx.mod.Module binds and runs it."""
    x = mx.sym.var('data')
    conv = mx.sym.Convolution(x, num_filter=4, kernel=(3, 3), name='conv')
    sym = mx.sym.FullyConnected(mx.sym.relu(conv), num_hidden=3, name='fc')
    shapes, _, _ = sym.infer_shape(data=(2, 3, 6, 6))
    rng = np.random.RandomState(0)
    args = {n: mx.nd.array(rng.normal(scale=0.3, size=s))
            for n, s in zip(sym.list_arguments(), shapes) if n != 'data'}
    for optional, stored in ((False, 'float32'), (True, 'bfloat16')):
        out, new_args, _ = amp.convert_model(sym, args, {}, target_dtype='bfloat16',
                                             target_dtype_ops=['Convolution'],
                                             cast_optional_params=optional)
        assert mxmp._src.dtypes.dtype_name(new_args['conv_weight'].dtype) == stored
        assert cast_dtypes_into(out, 'conv') == (['bfloat16'] if optional else
                                                 ['bfloat16'] * 3)
        types = dict(zip(out.list_arguments(), out.infer_type(data='float32')[0]))
        for name, value in new_args.items():
            assert np.dtype(types[name]) == np.dtype(value.dtype), name


def test_an_op_in_no_list_runs_in_its_data_dtype_with_its_parameters():
    """contrib.amp's rule for an op left out of every list: it runs in the dtype of its data
    and its parameters are stored in that dtype, whatever cast_optional_params says. mxmp's
    native pass widens instead (all inputs to the widest dtype, parameters included)."""
    data = mx.sym.var('data')
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), no_bias=True, name='conv')
    bn = mx.sym.BatchNorm(conv, fix_gamma=False, name='bn')
    sym = mx.sym.FullyConnected(bn, num_hidden=3, name='fc')
    mod = mx.mod.Module(sym, label_names=None)
    mod.bind(data_shapes=[('data', (2, 3, 6, 6))], for_training=False)
    mod.init_params(mx.init.Xavier())
    args, aux = mod.get_params()
    out, new_args, new_aux = amp.convert_model(sym, args, aux, target_dtype='bfloat16',
                                               target_dtype_ops=['Convolution'])
    dtype = mxmp._src.dtypes.dtype_name
    assert dtype(new_args['fc_weight'].dtype) == dtype(new_args['fc_bias'].dtype) == 'bfloat16'
    assert dtype(new_args['conv_weight'].dtype) == 'float32'    # cast in the graph
    assert dtype(new_aux['bn_moving_mean'].dtype) == 'float32'  # BatchNorm's statistics
    assert cast_dtypes_into(out, 'fc') == []                    # bfloat16 straight from bn
    plain = mx.mod.Module(out, label_names=None)
    plain.bind(data_shapes=[('data', (2, 3, 6, 6))], for_training=False)
    plain.set_params(new_args, new_aux)
    if mxmp.lp_kernels_available('bfloat16'):
        x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 3, 6, 6)))
        mod.forward(mx.io.DataBatch([x]), is_train=False)
        plain.forward(mx.io.DataBatch([x]), is_train=False)
        got = mx.nd.amp_cast(plain.get_outputs()[0], dtype='float32').asnumpy()
        ref = mod.get_outputs()[0].asnumpy()
        # measured over seeds 0-4: at most 1.5% of max|ref| (1.1% without oneDNN fusion)
        assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()
    # mxmp's own pass (Policy without follow_params) keeps the FullyConnected in float32
    native = mxmp.convert_symbol(sym, policy=amp._policy('bfloat16', ['Convolution'], None,
                                                         None, None).replace(
                                                             follow_params=False))
    assert cast_dtypes_into(native, 'fc') == ['float32']


# --- init is a process-wide switch ---------------------------------------------------------------
def conv_net(seed=0):
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, in_channels=3), nn.BatchNorm(), nn.Activation('relu'),
            nn.Dense(4))
    net.initialize(mx.init.Xavier())
    return net


def test_init_before_the_network_is_built_trains_it_in_bfloat16_not_float32():
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (4, 3, 8, 8)))
    y = mx.nd.array([0, 1, 2, 3])
    first = {}
    for mode in ('float32', 'bfloat16'):
        if mode == 'bfloat16':
            amp.init(target_dtype='bfloat16')
        net = conv_net()
        net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
        if mode == 'bfloat16':
            amp.init_trainer(trainer)
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
            if mode == 'bfloat16':
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
            else:
                loss.backward()
        trainer.step(4)
        first[mode] = loss.asnumpy()
    # the executed graph computes in bfloat16 (casts, or emulation's bfloat16 rounding nodes)
    assert mxmp._src.graph.strip.converted_dtype(mxmp.converted_graph(net)) == 'bfloat16'
    assert not np.array_equal(first['bfloat16'], first['float32'])
    np.testing.assert_allclose(first['bfloat16'], first['float32'], rtol=0.05, atol=0.02)


def test_init_after_hybridize_applies_at_the_next_cache_clear():
    net = conv_net()
    net.hybridize()
    x = mx.nd.ones((2, 3, 8, 8))
    net(x)
    amp.init('bfloat16')
    with pytest.raises(RuntimeError, match='no mixed-precision graph'):
        mxmp.converted_graph(net)                  # the float32 graph was built before init
    net.hybridize()
    net(x)
    assert mxmp._src.graph.strip.converted_dtype(mxmp.converted_graph(net)) == 'bfloat16'


def test_init_leaves_symbol_functions_and_imperative_code_working():
    """What contrib.amp's init breaks in GluonCV's scripts (MXNet 1.9.1, bfloat16 on CPU)."""
    amp.init('bfloat16')
    assert mx.sym.arange(0, 4).eval()[0].asnumpy().tolist() == [0, 1, 2, 3]
    assert mx.sym.random.uniform(shape=(2,)).eval()[0].shape == (2,)
    conv = nn.Conv2D(4, 1, in_channels=3)
    conv.initialize()
    with pytest.warns(UserWarning, match='runs imperatively, in float32.*hybridize'):
        feat = conv(mx.nd.ones((1, 3, 2, 2)))      # YOLO3's target generator runs imperatively
    assert mx.nd.concat(feat.reshape((1, -1)), mx.nd.ones((1, 3)), dim=1).shape == (1, 19)


def test_the_imperative_warning_is_given_once_per_block_type(recwarn):
    amp.init('bfloat16')
    conv = nn.Conv2D(4, 1, in_channels=3)
    conv.initialize()
    for _ in range(3):
        conv(mx.nd.ones((1, 3, 2, 2)))
    relevant = [w for w in recwarn.list if 'runs imperatively' in str(w.message)]
    assert len(relevant) <= 1   # 0 if an earlier test of this process warned for Conv2D


def test_disable_turns_the_switch_off_for_graphs_built_afterwards():
    amp.init('bfloat16')
    amp.disable()
    net = conv_net()
    net.hybridize()
    net(mx.nd.ones((2, 3, 8, 8)))
    with pytest.raises(RuntimeError, match='no mixed-precision graph'):
        mxmp.converted_graph(net)


def test_convert_hybrid_block_leaves_the_original_in_float32():
    net = mlp()
    x, _ = problem()
    ref = net(x).asnumpy()
    converted = amp.convert_hybrid_block(net, target_dtype='bfloat16')
    assert converted is not net and isinstance(converted, gluon.SymbolBlock)
    np.testing.assert_array_equal(net(x).asnumpy(), ref)
    assert not np.array_equal(converted(x).asnumpy(), ref)


def test_convert_hybrid_block_copies_the_parameters_and_leaves_the_original_alone():
    """MXNet's own test converts one block several times, the last with cast_optional_params."""
    net = mlp()
    x, _ = problem()
    ref = net(x).asnumpy()
    first = amp.convert_hybrid_block(net, target_dtype='bfloat16', cast_optional_params=True,
                                     ctx=mx.cpu(1))
    again = amp.convert_hybrid_block(net, target_dtype='bfloat16', ctx=mx.cpu(1))
    for name, param in net.collect_params().items():
        assert dtype_name(param.dtype) == 'float32' and param.list_ctx() == [mx.cpu(0)]
        copy = first.collect_params()[name]
        assert copy is not param and copy.list_ctx() == [mx.cpu(1)]
        rounded = mx.nd.amp_cast(mx.nd.amp_cast(param.data(), dtype=bfloat16), dtype='float32')
        copied = mx.nd.amp_cast(copy.data(mx.cpu(1)), dtype='float32')
        np.testing.assert_array_equal(copied.asnumpy(), rounded.asnumpy())
    assert {dtype_name(p.dtype) for n, p in first.collect_params().items()
            if n.endswith('weight')} == {'bfloat16'}
    assert {dtype_name(p.dtype) for p in again.collect_params().values()} == {'float32'}
    np.testing.assert_array_equal(net(x).asnumpy(), ref)
    out = again(x.as_in_context(mx.cpu(1))).asnumpy()
    assert 0 < np.abs(out - ref).max() < 0.05 * np.abs(ref).max()


def test_convert_hybrid_block_of_a_block_without_values_names_the_fix():
    net = nn.HybridSequential()
    net.add(nn.Dense(4))            # in_units unknown: no value until the first batch
    net.initialize()
    with pytest.raises(ValueError, match='run it once on a batch before convert_hybrid_block'):
        amp.convert_hybrid_block(net, target_dtype='bfloat16')


def test_a_policy_is_accepted_where_contrib_amp_takes_the_target_dtype():
    policy = mxmp.Policy('bfloat16', fp32_ops=['Activation'], loss_scaler='dynamic')
    sym = conv_net()(mx.sym.var('data'))
    nodes = json.loads(amp.convert_symbol(sym, policy).tojson(remove_amp_cast=False))['nodes']
    act = next(n for n in nodes if n['op'] == 'Activation')
    cast = nodes[act['inputs'][0][0]]          # relu moved to float32 by the policy
    assert cast['op'] == 'amp_cast' and cast['attrs']['dtype'] == 'float32'
    with pytest.raises(ValueError, match='holds the op lists'):
        amp.convert_symbol(sym, policy, fp32_ops=['Activation'])
    amp.init(policy)
    net = conv_net()
    net.hybridize()
    net(mx.nd.ones((2, 3, 8, 8)))
    graph = json.loads(mxmp.converted_graph(net).tojson(remove_amp_cast=False))['nodes']
    act = next(n for n in graph if n['op'] == 'Activation')
    assert graph[act['inputs'][0][0]]['op'] == 'amp_cast'
    trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1})
    amp.init_trainer(trainer)
    assert trainer._amp_loss_scaler.loss_scale == 2.0 ** 16   # the policy's dynamic scaling
    with pytest.raises(ValueError, match='holds the op lists'):
        amp.init(policy, fp32_ops=['Activation'])
