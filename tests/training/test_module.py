"""Tests of mxmp._src.training.module: the mixed-precision Symbolic Module and its loss-scale node.

CPU only. oneDNN's bfloat16 kernels need AVX-512 and MXNet has no float16 GEMM on CPU, so the
low-precision Modules here run with ``emulate=True`` (the same mixed-precision graph, float32
kernels, every low-precision tensor rounded through the target dtype) unless
``mxmp.lp_kernels_available`` says real kernels run.
"""
import json
import os

import numpy as np
import pytest
import mxnet as mx
from mxnet import nd

import mxmp
from mxmp._src.training.bucketing import BucketingModule
from mxmp._src.graph.loss_heads import (HEAD_GRADIENT_LOSS_OPS, LOSS_SCALE_NAME,
    insert_loss_scale)
from mxmp._src.training.module import Module
from mxmp._src.policy.policy import LOSS_OUTPUT
from mxmp._src.scaling import DynamicLossScaler, StaticLossScaler
from helpers import CLASSES, EMULATE, FEATURES, MODULE_BATCH, batch_of, bf16, device_params, mlp, module_initial_params, module_optimizer_state, np_params, problem, ready  # noqa: E402

TWO_CPUS = [mx.cpu(0), mx.cpu(1)]


def step(mod, x, y):
    mod.forward_backward(batch_of(x, y))
    return mod.update()


def cross_entropy(mod, x, y):
    it = mx.io.NDArrayIter(x, y, batch_size=MODULE_BATCH)
    return dict(mod.score(it, mx.metric.CrossEntropy()))['cross-entropy']


# ---------------------------------------------------------------------------- loss-scale node
@pytest.mark.parametrize('target', ['float32', 'bfloat16'])
def test_loss_scale_node_keeps_forward_bit_identical_and_scales_gradients_exactly(target):
    x, y = problem(MODULE_BATCH, seed=3)
    x[0, 0] = 0.0
    runs = {}
    for name, scaler in (('plain', 'none'), ('scaled', StaticLossScaler(2.0 ** 12))):
        kw = bf16() if target == 'bfloat16' else {'target_dtype': 'float32'}
        mod = ready(Module(mlp(), loss_scaler=scaler, **kw))
        mod.forward(batch_of(x, y), is_train=True)
        mod.backward()
        group = mod._exec_group
        runs[name] = (mod.get_outputs()[0].asnumpy(),
                      {n: g[0].asnumpy() for n, g in zip(group.param_names, group.grad_arrays)},
                      mod.loss_scale_nodes)
    assert runs['plain'][2] == 0 and runs['scaled'][2] == 1
    np.testing.assert_array_equal(runs['plain'][0], runs['scaled'][0])
    for name, grad in runs['plain'][1].items():
        assert np.abs(grad).max() > 0
        np.testing.assert_array_equal(grad * 2.0 ** 12, runs['scaled'][1][name])


@pytest.mark.parametrize('loss', ['LinearRegressionOutput', 'LogisticRegressionOutput',
                                  'MAERegressionOutput', 'MakeLoss', 'SVMOutput'])
def test_loss_scale_node_in_front_of_each_loss_output(loss):
    data, label, w = mx.sym.var('data'), mx.sym.var('label'), mx.sym.var('w')
    fc = mx.sym.FullyConnected(data, w, num_hidden=3, no_bias=True, name='fc')
    head = mx.sym.MakeLoss(mx.sym.square(fc)) if loss == 'MakeLoss' \
        else getattr(mx.sym, loss)(fc, label, name='loss')
    scaled, count, _ = insert_loss_scale(head)
    assert count == 1 and LOSS_SCALE_NAME in scaled.list_arguments()
    rng = np.random.RandomState(0)
    values = {'data': rng.randn(6, 5), 'w': rng.randn(3, 5),
              'label': rng.randint(0, 2, (6,) if loss == 'SVMOutput' else (6, 3))}
    results = []
    for sym, scale in ((head, None), (scaled, 2.0 ** 9)):
        args = {k: nd.array(v) for k, v in values.items() if k in sym.list_arguments()}
        if scale is not None:
            args[LOSS_SCALE_NAME] = nd.array([scale])
        grads = {'w': nd.zeros((3, 5))}
        exe = sym.bind(mx.cpu(), args, args_grad=grads,
                       grad_req={k: 'write' if k == 'w' else 'null' for k in args})
        exe.forward(is_train=True)
        exe.backward()
        results.append((exe.outputs[0].asnumpy(), grads['w'].asnumpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert np.abs(results[0][1]).max() > 0
    np.testing.assert_array_equal(results[0][1] * 2.0 ** 9, results[1][1])


def _loss_head(op):
    """``op`` applied to ``data`` (and ``label``), built from JSON by its registered name."""
    one_input = op in ('MakeLoss', 'make_loss', '_sparse_make_loss')
    nodes = [{'op': 'null', 'name': 'data', 'inputs': []}]
    if not one_input:
        nodes.append({'op': 'null', 'name': 'label', 'inputs': []})
    nodes.append({'op': op, 'name': 'loss', 'inputs': [[i, 0, 0] for i in range(len(nodes))]})
    sym = mx.sym.load_json(json.dumps({'nodes': nodes, 'heads': [[len(nodes) - 1, 0, 0]],
                                       'arg_nodes': list(range(len(nodes) - 1)),
                                       'attrs': {'mxnet_version': ['int', 10901]}}))
    if one_input:
        return sym, {'data': (2, 5)}
    if 'ctc' in op.lower():
        return sym, {'data': (4, 2, 5), 'label': (2, 3)}
    return sym, {'data': (2, 5), 'label': (2, 5) if 'Regression' in op else (2,)}


def test_head_gradient_loss_ops_are_exactly_the_loss_ops_mxnet_asks_a_head_gradient_for():
    """The node goes in front of the loss ops that make their own gradient; the others
    (HEAD_GRADIENT_LOSS_OPS) take the gradient of their output, scaled downstream."""
    ops = sorted(mxmp.Policy('bfloat16').ops_in(LOSS_OUTPUT))
    needs_head = set()
    for op in ops:
        sym, shapes = _loss_head(op)
        exe = sym.simple_bind(mx.cpu(), grad_req={'data': 'write', 'label': 'null'}, **shapes)
        for name, arr in exe.arg_dict.items():
            arr[:] = nd.ones(arr.shape) if name == 'label' else nd.random.uniform(shape=arr.shape)
        exe.forward(is_train=True)
        try:
            exe.backward()
            nd.waitall()
        except mx.base.MXNetError as err:
            assert 'head_gradient is required' in str(err)
            needs_head.add(op)
    assert needs_head == set(HEAD_GRADIENT_LOSS_OPS)


def test_make_loss_over_softmax_cross_entropy_scales_the_gradient_once():
    data, label = mx.sym.var('data'), mx.sym.var('softmax_label')
    fc = mx.sym.FullyConnected(data, num_hidden=CLASSES, name='fc')
    sym = mx.sym.MakeLoss(mx.sym.softmax_cross_entropy(fc, label), name='loss')
    x, y = problem(MODULE_BATCH)
    grads = []
    for scaler in ('none', StaticLossScaler(2.0 ** 7)):
        mod = Module(sym, target_dtype='float32', loss_scaler=scaler)
        mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
                 label_shapes=[('softmax_label', (MODULE_BATCH,))])
        mod.init_params(arg_params=module_initial_params(sym), aux_params={})
        mod.forward_backward(batch_of(x, y))
        grads.append(mod._exec_group.grad_arrays[0][0].asnumpy())
    assert mod.loss_scale_nodes == 1
    np.testing.assert_array_equal(grads[0] * 2.0 ** 7, grads[1])


def test_out_grads_of_non_loss_heads_are_scaled_and_input_gradients_reported_unscaled():
    data = mx.sym.var('data')
    sym = mx.sym.FullyConnected(data, num_hidden=3, name='fc')
    x = np.random.RandomState(0).randn(8, FEATURES).astype(np.float32)
    head_grad = nd.array(np.random.RandomState(1).randn(8, 3))
    results = []
    for scaler in ('none', StaticLossScaler(2.0 ** 10)):
        mod = Module(sym, label_names=None, target_dtype='float32', loss_scaler=scaler)
        mod.bind(data_shapes=[('data', (8, FEATURES))], inputs_need_grad=True)
        mod.init_params(arg_params=module_initial_params(sym, batch=8), aux_params={})
        mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .5})
        mod.forward(mx.io.DataBatch(data=[nd.array(x)]), is_train=True)
        mod.backward(out_grads=[head_grad])
        input_grad = mod.get_input_grads()[0].asnumpy()
        param_grad = mod._exec_group.grad_arrays[0][0].asnumpy()
        assert mod.update()
        results.append((input_grad, param_grad, np_params(mod)['fc_weight']))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1] * 2.0 ** 10, results[1][1])
    np.testing.assert_array_equal(results[0][2], results[1][2])


def test_loss_scale_input_is_a_state_not_a_parameter_and_symbol_is_float32():
    mod = ready(Module(mlp(), loss_scaler='dynamic', **bf16()))
    assert LOSS_SCALE_NAME in mod.mxmp_symbol.list_arguments()
    assert LOSS_SCALE_NAME not in mod.symbol.list_arguments()
    assert mxmp.count_casts(mod.symbol)['amp_cast'] == 0
    assert mxmp.count_casts(mod.mxmp_symbol)['amp_cast'] > 0
    arg, aux = mod.get_params()
    assert LOSS_SCALE_NAME not in arg and LOSS_SCALE_NAME not in aux
    assert LOSS_SCALE_NAME not in mod._optimizer.idx2name.values()
    assert mod.get_states(merge_multi_context=False) == []
    mod.set_states(value=0)   # user states: none here; the loss scale survives
    scale_arr = mod._exec_group.execs[0].arg_dict[LOSS_SCALE_NAME]
    assert scale_arr.asnumpy().tolist() == [2.0 ** 16]


def test_bfloat16_without_kernels_and_without_emulation_is_refused_up_front():
    if mxmp.lp_kernels_available('bfloat16'):
        pytest.skip('this CPU has bfloat16 kernels')
    with pytest.raises(RuntimeError, match='emulate=True'):
        Module(mlp(), target_dtype='bfloat16', emulate=False)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match='unknown target dtype'):
        Module(mlp(), target_dtype='int8')
    with pytest.raises(ValueError, match='unknown loss_scaler'):
        Module(mlp(), target_dtype='float32', loss_scaler='sometimes')
    mod = Module(mlp(), loss_scaler='dynamic', **bf16())
    with pytest.raises(ValueError, match='already holds the loss-scale input'):
        Module(mod.mxmp_symbol, **bf16())
    mod = Module(mlp(), **bf16())
    mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
             label_shapes=[('softmax_label', (MODULE_BATCH,))])
    mod.init_params()
    with pytest.raises(ValueError, match='asynchronous kvstore'):
        mod.init_optimizer(kvstore='dist_async')


# ---------------------------------------------------------------------------- training
def test_bfloat16_module_with_dynamic_scaling_trains_to_float32_loss():
    x, y = problem(512)
    losses, scales = {}, []
    for name, kw in (('float32', {'target_dtype': 'float32', 'loss_scaler': 'none'}),
                     ('bfloat16', bf16(loss_scaler=DynamicLossScaler(init_scale=2.0 ** 8,
                                                                     growth_interval=10)))):
        mod = Module(mlp(), **kw)
        mx.random.seed(0)
        mod.fit(mx.io.NDArrayIter(x, y, batch_size=MODULE_BATCH), num_epoch=6,
                arg_params=module_initial_params(), aux_params={}, optimizer='sgd',
                optimizer_params={'learning_rate': .1, 'momentum': .9},
                batch_end_callback=lambda p, m=mod: scales.append(m.loss_scale)
                if name == 'bfloat16' else None)
        losses[name] = cross_entropy(mod, x, y)
        if name == 'bfloat16':
            assert mod.skipped_steps == 0
            assert mod.loss_scaler.dynamic
            assert mod.loss_scale == 2.0 ** 8 * 2 ** (6 * 16 // 10)
    first = cross_entropy(ready(Module(mlp(), target_dtype='float32')), x, y)
    assert losses['float32'] < first / 5
    assert abs(losses['bfloat16'] - losses['float32']) < 0.1 * losses['float32'] + 0.01
    assert scales[0] == 2.0 ** 8 and scales[-1] == 2.0 ** 17 and sorted(scales) == scales


def test_injected_overflow_skips_exactly_one_update_halves_scale_and_changes_nothing():
    x, y = problem(3 * MODULE_BATCH)
    mod = ready(Module(mlp(), context=TWO_CPUS, cast_params=True,
                       loss_scaler=DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=100),
                       **bf16()))
    assert mod.cast_params and mod.master_weights('fc1_weight')[0].dtype == np.float32
    assert step(mod, x[:MODULE_BATCH], y[:MODULE_BATCH]) and step(mod, x[MODULE_BATCH:2 * MODULE_BATCH], y[MODULE_BATCH:2 * MODULE_BATCH])
    before = (np_params(mod), device_params(mod), module_optimizer_state(mod))
    bad = x[2 * MODULE_BATCH:].copy()
    bad[-1, 3] = np.inf            # one sample, on the second context only
    assert step(mod, bad, y[2 * MODULE_BATCH:]) is False
    assert mod.skipped_steps == 1
    assert mod.loss_scale == 2.0 ** 9
    after = (np_params(mod), device_params(mod), module_optimizer_state(mod))
    for name, value in before[0].items():
        np.testing.assert_array_equal(value, after[0][name])
    for key, value in before[1].items():
        np.testing.assert_array_equal(value, after[1][key])
    states0, counts0, num0 = before[2]
    states1, counts1, num1 = after[2]
    assert counts0 == counts1 and num0 == num1 and states0.keys() == states1.keys()
    for idx, value in states0.items():
        np.testing.assert_array_equal(value, states1[idx])
    assert step(mod, x[2 * MODULE_BATCH:], y[2 * MODULE_BATCH:]) is True
    assert mod.skipped_steps == 1 and mod.loss_scale == 2.0 ** 9
    assert not np.array_equal(np_params(mod)['fc1_weight'], before[0]['fc1_weight'])


def test_scale_grows_after_its_interval_and_the_graph_sees_the_new_scale():
    x, y = problem(MODULE_BATCH)
    mod = ready(Module(mlp(), loss_scaler=DynamicLossScaler(init_scale=2.0 ** 4,
                                                            growth_interval=3), **bf16()))
    scales = []
    for _ in range(7):
        assert step(mod, x, y)
        scales.append(mod.loss_scale)
    assert scales == [16., 16., 32., 32., 32., 64., 64.]
    assert mod.loss_scaler.counter == 1
    mod.forward(batch_of(x, y), is_train=True)
    assert mod._exec_group.execs[0].arg_dict[LOSS_SCALE_NAME].asscalar() == 64.


def test_float16_gradients_that_overflow_back_the_scale_off_until_they_fit():
    """float16 (emulated on CPU): at S = 2**24 the scaled gradients exceed float16's maximum
    65504 and become inf; the Module skips and halves S until they fit, then trains."""
    x, y = problem(MODULE_BATCH)
    mod = ready(Module(mlp(), target_dtype='float16', emulate=True,
                       loss_scaler=DynamicLossScaler(init_scale=2.0 ** 24, growth_interval=1000)),
                lr=.05)
    start = np_params(mod)
    applied = [step(mod, x, y) for _ in range(12)]
    first = applied.index(True)
    assert first >= 1 and not any(applied[:first]) and all(applied[first:])
    assert mod.skipped_steps == first and mod.loss_scale == 2.0 ** (24 - first)
    assert mod.loss_scale <= 2.0 ** 16   # weight gradients sum 32 samples: more headroom
    for name, value in np_params(mod).items():
        assert np.isfinite(value).all() and not np.array_equal(value, start[name])


def test_master_weights_keep_float32_precision_and_device_weights_are_their_rounding():
    x, y = problem(MODULE_BATCH)
    mod = ready(Module(mlp(), cast_params=True, loss_scaler='dynamic', **bf16()), lr=.01)
    for _ in range(3):
        assert step(mod, x, y)
    masters = mod.master_weights('fc1_weight')
    device = mod._exec_group.param_arrays[mod._exec_group.param_names.index('fc1_weight')][0]
    assert device.dtype != np.float32     # stored in bfloat16
    rounded = nd.amp_cast(nd.amp_cast(masters[0], dtype=device.dtype), dtype='float32')
    np.testing.assert_array_equal(rounded.asnumpy(), nd.amp_cast(device, dtype='float32')
                                  .asnumpy())
    assert not np.array_equal(rounded.asnumpy(), masters[0].asnumpy())
    np.testing.assert_array_equal(np_params(mod)['fc1_weight'], masters[0].asnumpy())


@pytest.mark.parametrize('target, tolerance', [
    ('float32', 1e-5),
    # bfloat16: each context rounds its half-batch weight gradient to bfloat16 (8 significant
    # bits) before the float32 reduction, one context rounds the whole sum: updates agree to
    # about 2**-8 of their size.
    ('bfloat16', 2.0 ** -6)])
def test_two_contexts_update_like_one_context_on_the_concatenated_batch(target, tolerance):
    x, y = problem(4 * MODULE_BATCH, seed=5)
    kw = bf16(cast_params=True) if target == 'bfloat16' else {'target_dtype': 'float32'}
    results = []
    for ctx in (mx.cpu(0), TWO_CPUS):
        mod = ready(Module(mlp(), context=ctx,
                           loss_scaler=DynamicLossScaler(init_scale=2.0 ** 10,
                                                         growth_interval=2), **kw),
                    batch=2 * MODULE_BATCH)
        for k in range(2):
            assert step(mod, x[k * 2 * MODULE_BATCH:(k + 1) * 2 * MODULE_BATCH],
                        y[k * 2 * MODULE_BATCH:(k + 1) * 2 * MODULE_BATCH])
        results.append((np_params(mod), mod.loss_scale))
    assert results[0][1] == results[1][1] == 2.0 ** 11
    start = module_initial_params(batch=2 * MODULE_BATCH)
    for name, value in results[0][0].items():
        one = value - start[name].asnumpy()
        two = results[1][0][name] - start[name].asnumpy()
        assert np.abs(one).max() > 1e-3
        assert np.abs(two - one).max() <= tolerance * np.abs(one).max(), name


# ---------------------------------------------------------------------------- checkpoints
def test_checkpoint_round_trip_and_plain_mxnet_reads_the_files(tmp_path):
    prefix = str(tmp_path / 'mlp')
    x, y = problem(2 * MODULE_BATCH)
    scaler = DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=50)
    mod = ready(Module(mlp(), cast_params=True, loss_scaler=scaler, **bf16()))
    assert step(mod, x[:MODULE_BATCH], y[:MODULE_BATCH])
    bad = x[MODULE_BATCH:].copy()
    bad[0] = np.nan
    assert not step(mod, bad, y[MODULE_BATCH:])
    assert step(mod, x[MODULE_BATCH:], y[MODULE_BATCH:])
    mod.save_checkpoint(prefix, 3, save_optimizer_states=True)
    saved = np_params(mod)
    for suffix in ('-symbol.json', '-0003.params', '-0003.states', '-0003.mxmp.json'):
        assert os.path.exists(prefix + suffix)
    assert not [f for f in os.listdir(tmp_path) if f.endswith('.tmp')]
    graph = json.load(open(prefix + '-symbol.json'))
    ops = {n['op'] for n in graph['nodes']}
    assert 'amp_cast' not in ops and 'BlockGrad' not in ops
    assert LOSS_SCALE_NAME not in {n['name'] for n in graph['nodes']}
    state = json.load(open(prefix + '-0003.mxmp.json'))
    assert state['skipped_steps'] == 1 and state['loss_scaler']['scale'] == 2.0 ** 9

    # plain MXNet: float32 symbol and parameters
    plain = mx.mod.Module.load(prefix, 3)
    plain.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
               label_shapes=[('softmax_label', (MODULE_BATCH,))], for_training=False)
    arg, _ = plain.get_params()
    assert all(v.dtype == np.float32 for v in arg.values())
    for name, value in saved.items():
        np.testing.assert_array_equal(arg[name].asnumpy(), value)
    plain.forward(batch_of(x[:MODULE_BATCH], y[:MODULE_BATCH]), is_train=False)
    mod.forward(batch_of(x[:MODULE_BATCH], y[:MODULE_BATCH]), is_train=False)
    np.testing.assert_allclose(plain.get_outputs()[0].asnumpy(),
                               mod.get_outputs()[0].asnumpy(), atol=0.03)

    # plain MXNet reads the optimizer states file too (momentum of the float32 masters)
    plain = mx.mod.Module.load(prefix, 3, load_optimizer_states=True)
    plain.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
               label_shapes=[('softmax_label', (MODULE_BATCH,))])
    plain.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .1, 'momentum': .9})
    for idx, value in module_optimizer_state(mod)[0].items():
        np.testing.assert_array_equal(plain._updater.states[idx].asnumpy(), value)

    # mxmp: everything back, from the files alone
    back = Module.load(prefix, 3, load_optimizer_states=True, emulate=EMULATE)
    assert back.target_dtype == 'bfloat16' and back.cast_params
    assert back.loss_scaler == mod.loss_scaler and back.skipped_steps == 1
    ready(back)
    for name, value in saved.items():
        np.testing.assert_array_equal(back.master_weights(name)[0].asnumpy(), value)
    states, counts, num_update = module_optimizer_state(back)
    assert (counts, num_update) == module_optimizer_state(mod)[1:] and num_update == 2
    for idx, value in module_optimizer_state(mod)[0].items():
        np.testing.assert_array_equal(states[idx], value)
    assert step(back, x[:MODULE_BATCH], y[:MODULE_BATCH]) and step(mod, x[:MODULE_BATCH], y[:MODULE_BATCH])
    for name, value in np_params(mod).items():
        np.testing.assert_array_equal(np_params(back)[name], value)


def test_loading_with_another_loss_scaler_configuration_raises(tmp_path):
    prefix = str(tmp_path / 'mlp')
    mod = ready(Module(mlp(), loss_scaler=DynamicLossScaler(growth_interval=10), **bf16()))
    mod.save_checkpoint(prefix, 1)
    with pytest.raises(ValueError, match='growth_interval'):
        Module.load(prefix, 1, loss_scaler=DynamicLossScaler(growth_interval=20),
                    emulate=EMULATE)


def test_plain_mxnet_checkpoint_loads_into_mxmp_module(tmp_path):
    prefix = str(tmp_path / 'plain')
    x, y = problem(MODULE_BATCH)
    plain = mx.mod.Module(mlp())
    ready(plain)
    step(plain, x, y)
    plain.save_checkpoint(prefix, 2)
    mod = Module.load(prefix, 2, loss_scaler='dynamic', **bf16())
    assert mod.loss_scale == 2.0 ** 16 and mod.skipped_steps == 0
    mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
             label_shapes=[('softmax_label', (MODULE_BATCH,))])
    for name, value in np_params(plain).items():
        np.testing.assert_array_equal(np_params(mod)[name], value)
    plain.forward(batch_of(x, y), is_train=False)
    mod.forward(batch_of(x, y), is_train=False)
    np.testing.assert_allclose(mod.get_outputs()[0].asnumpy(),
                               plain.get_outputs()[0].asnumpy(), atol=0.03)
    mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .1})
    assert step(mod, x, y)


def test_fit_with_checkpoint_callback_and_validation(tmp_path):
    prefix = str(tmp_path / 'fit')
    x, y = problem(4 * MODULE_BATCH)
    mod = Module(mlp(), context=TWO_CPUS, loss_scaler=DynamicLossScaler(init_scale=2.0 ** 5,
                                                                       growth_interval=2),
                 **bf16())
    seen = []
    mod.fit(mx.io.NDArrayIter(x, y, batch_size=MODULE_BATCH), num_epoch=2,
            eval_data=mx.io.NDArrayIter(x, y, batch_size=MODULE_BATCH), eval_metric='acc',
            arg_params=module_initial_params(), aux_params={},
            batch_end_callback=[mx.callback.Speedometer(MODULE_BATCH, 2),
                                lambda p: seen.append((p.epoch, mod.loss_scale))],
            epoch_end_callback=mod.checkpoint_callback(prefix))
    assert seen[-1] == (1, 2.0 ** 9) and len(seen) == 8
    for epoch in (1, 2):
        state = json.load(open('%s-%04d.mxmp.json' % (prefix, epoch)))
        assert state['loss_scaler']['scale'] == 2.0 ** (5 + 2 * epoch)
    back = Module.load(prefix, 2, emulate=EMULATE)
    assert back.loss_scale == 2.0 ** 9


# ---------------------------------------------------------------------------- bucketing
def bucket_sym_gen(length):
    data = mx.sym.var('data')
    h = mx.sym.FullyConnected(data, num_hidden=8, flatten=False, name='fc1')
    pooled = mx.sym.mean(mx.sym.relu(h), axis=1)
    out = mx.sym.FullyConnected(pooled, num_hidden=CLASSES, name='fc2')
    return mx.sym.SoftmaxOutput(out, name='softmax'), ('data',), ('softmax_label',)


def bucket_batch(rng, length, poison=False):
    x = rng.randn(MODULE_BATCH, length, 5).astype(np.float32)
    if poison:
        x[0, 0, 0] = np.inf
    return mx.io.DataBatch(
        data=[nd.array(x)], label=[nd.array(rng.randint(0, CLASSES, MODULE_BATCH))],
        bucket_key=length, provide_data=[mx.io.DataDesc('data', (MODULE_BATCH, length, 5))],
        provide_label=[mx.io.DataDesc('softmax_label', (MODULE_BATCH,))])


def bind_bucketing(mod):
    mod.bind(data_shapes=[('data', (MODULE_BATCH, 8, 5))], label_shapes=[('softmax_label', (MODULE_BATCH,))])


def new_bucketing_module():
    """bfloat16, cast_params, dynamic scaling from 2**6 growing every 2 steps; bound, SGD."""
    mod = BucketingModule(bucket_sym_gen, default_bucket_key=8, cast_params=True,
                          loss_scaler=DynamicLossScaler(init_scale=2.0 ** 6, growth_interval=2),
                          **bf16())
    bind_bucketing(mod)
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .1})
    return mod


def test_bucketing_module_buckets_share_one_loss_scaler_and_skip_together():
    rng = np.random.RandomState(0)
    mod = new_bucketing_module()
    for length in (8, 4, 4, 8):
        mod.forward_backward(bucket_batch(rng, length))
        assert mod.update() is True   # as mxmp.Module.update (MXNet's returns None)
    assert set(mod._buckets) == {4, 8}
    assert all(isinstance(m, Module) for m in mod._buckets.values())
    assert mod.loss_scale == 2.0 ** 8
    before = {k: v.asnumpy().copy() for k, v in mod.get_params()[0].items()}
    mod.forward_backward(bucket_batch(rng, 4, poison=True))
    with pytest.warns(mxmp.NonFiniteForwardWarning):   # an inf input, not a scaling overflow
        assert mod.update() is False
    assert mod.skipped_steps == 1 and mod.loss_scale == 2.0 ** 7
    for name, value in mod.get_params()[0].items():
        np.testing.assert_array_equal(value.asnumpy(), before[name])


def test_bucketing_checkpoint_round_trip_keeps_parameters_and_loss_scale(tmp_path):
    rng = np.random.RandomState(0)
    mod = new_bucketing_module()
    for length in (8, 4):
        mod.forward_backward(bucket_batch(rng, length))
        mod.update()
    mod.forward_backward(bucket_batch(rng, 4, poison=True))
    with pytest.warns(mxmp.NonFiniteForwardWarning):
        mod.update()
    assert (mod.loss_scale, mod.skipped_steps) == (2.0 ** 6, 1)
    prefix = str(tmp_path / 'bucket')
    mod.save_checkpoint(prefix, 1)
    saved = {k: v.asnumpy() for k, v in mod.get_params()[0].items()}

    back = BucketingModule.load(prefix, 1, sym_gen=bucket_sym_gen, default_bucket_key=8,
                                emulate=EMULATE)
    bind_bucketing(back)
    assert (back.loss_scale, back.skipped_steps) == (2.0 ** 6, 1)
    assert back._default_module().target_dtype == 'bfloat16'
    for name, value in back.get_params()[0].items():
        np.testing.assert_array_equal(value.asnumpy(), saved[name])
    back.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .1})
    back.forward_backward(bucket_batch(rng, 4))   # a bucket created after loading trains
    back.update()
    assert back.skipped_steps == 1 and set(back._buckets) == {4, 8}
    assert any(not np.array_equal(v.asnumpy(), saved[k])
               for k, v in back.get_params()[0].items())

    # plain MXNet reads the same files
    plain = mx.mod.BucketingModule.load(prefix, 1, sym_gen=bucket_sym_gen, default_bucket_key=8)
    bind_bucketing(plain)
    for name, value in plain.get_params()[0].items():
        np.testing.assert_array_equal(value.asnumpy(), saved[name])
    with pytest.raises(ValueError, match='sym_gen and default_bucket_key'):
        BucketingModule.load(prefix, 1)


# ---------------------------------------------------------------------------- policy
def test_policy_gives_the_precision_and_contradicting_shorthands_raise():
    policy = mxmp.Policy('bfloat16')
    mod = Module(mlp(), policy=policy, emulate=True, target_dtype='bfloat16')   # agreeing
    assert (mod.target_dtype, mod.policy.emulate) == ('bfloat16', True)
    with pytest.raises(ValueError, match="target_dtype='float16'.*'bfloat16'"):
        Module(mlp(), policy=policy, target_dtype='float16', emulate=True)


def test_emulate_auto_emulates_where_the_context_has_no_kernels():
    mod = Module(mlp(), target_dtype='float16')       # no CPU has float16 kernels
    assert mod.policy.emulate is True and mod.loss_scaler.dynamic


# ---------------------------------------------------------------------------- opaque gradients
class _SoftmaxCrossEntropyLoss(mx.operator.CustomOp):
    """A loss in Python: softmax forward, ``softmax - one_hot(label)`` backward, which ignores
    its output's gradient (``need_top_grad=False``)."""

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], nd.softmax(in_data[0]))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        label = in_data[1]
        self.assign(in_grad[0], req[0], out_data[0] - nd.one_hot(label, out_data[0].shape[1]))
        self.assign(in_grad[1], req[1], nd.zeros_like(label))


@mx.operator.register('mxmp_test_softmax_ce')
class _SoftmaxCrossEntropyLossProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=False)

    def list_arguments(self):
        return ['data', 'label']

    def infer_shape(self, in_shape):
        return [in_shape[0], (in_shape[0][0],)], [in_shape[0]], []

    def create_operator(self, ctx, shapes, dtypes):
        return _SoftmaxCrossEntropyLoss()


class _L2Attached(mx.operator.CustomOp):
    """Identity forward; backward ``out_grad + 0.5 * x``: a term of its own in the gradient."""

    def forward(self, is_train, req, in_data, out_data, aux):
        self.assign(out_data[0], req[0], in_data[0])

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        self.assign(in_grad[0], req[0], out_grad[0] + 0.5 * in_data[0])


@mx.operator.register('mxmp_test_l2_attached')
class _L2AttachedProp(mx.operator.CustomOpProp):
    def __init__(self):
        super().__init__(need_top_grad=True)

    def create_operator(self, ctx, shapes, dtypes):
        return _L2Attached()


def opaque_mlp(kind):
    """mlp() with a gradient mxmp cannot see by op name: a Custom loss head, a Custom op or
    IdentityAttachKLSparseReg in the middle that adds its own gradient term."""
    data, label = mx.sym.var('data'), mx.sym.var('softmax_label')
    h = mx.sym.FullyConnected(data, num_hidden=16, name='fc1')
    if kind == 'custom_penalty':
        h = mx.sym.Custom(h, op_type='mxmp_test_l2_attached', name='penalty')
    h = mx.sym.Activation(h, act_type='sigmoid' if kind == 'kl_sparse' else 'relu', name='act')
    if kind == 'kl_sparse':
        h = mx.sym.IdentityAttachKLSparseReg(h, sparseness_target=0.1, penalty=0.5,
                                             name='sparse')
    out = mx.sym.FullyConnected(h, num_hidden=CLASSES, name='fc2')
    if kind == 'custom_loss':
        return mx.sym.Custom(out, label, op_type='mxmp_test_softmax_ce', name='softmax')
    return mx.sym.SoftmaxOutput(out, label, name='softmax')


def _train_three_steps(mod, x, y):
    mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
             label_shapes=[('softmax_label', (MODULE_BATCH,))])
    _, _, aux_shapes = mod.symbol.infer_shape(data=(MODULE_BATCH, FEATURES))
    mod.init_params(arg_params=module_initial_params(opaque_mlp('custom_loss')),
                    aux_params={n: nd.full(s, 0.1) for n, s in
                                zip(mod.symbol.list_auxiliary_states(), aux_shapes)})
    mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .2, 'momentum': .9})
    for k in range(3):
        mod.forward_backward(batch_of(x[k::3], y[k::3]))
        assert mod.update() is not False
    # IdentityAttachKLSparseReg writes its moving average in its backward without the engine
    # ordering later reads after that write, and plain mx.mod.Module.get_params() copies the
    # aux states without waiting: it read the average of two steps instead of three in 2 of
    # 200 runs, 144 of 200 with OMP_NUM_THREADS=2 (measured, loaded machine), the test's old
    # flake. mxmp.Module waits
    # (test_get_params_reads_aux_states_after_the_backward_that_writes_them); plain MXNet is
    # compared once its last backward is done.
    nd.waitall()
    arg, aux = mod.get_params()
    return {k: v.asnumpy() for k, v in list(arg.items()) + list(aux.items())}


@pytest.mark.parametrize('kind', ['custom_loss', 'custom_penalty', 'kl_sparse'])
def test_opaque_gradients_are_scaled_and_train_as_plain_mxnet(kind):
    """Issue 36 item 1: each loss gradient is scaled where it enters (a Custom loss, a Custom
    op or IdentityAttachKLSparseReg adding its own term), so the update that divides by the
    loss scale moves the weights as plain MXNet: float32 bit for bit, float16 (emulated) within
    its rounding. Without the brackets the weights moved by 1/65536 of plain MXNet's step."""
    x, y = problem(3 * MODULE_BATCH, seed=4)
    plain = _train_three_steps(mx.mod.Module(opaque_mlp(kind)), x, y)
    start = module_initial_params(opaque_mlp('custom_loss'))
    f32 = Module(opaque_mlp(kind), target_dtype='float32', loss_scaler=StaticLossScaler(2.0 ** 10))
    assert f32.loss_scale_nodes >= 2
    for name, value in _train_three_steps(f32, x, y).items():
        np.testing.assert_array_equal(value, plain[name], err_msg=name)
    f16 = Module(opaque_mlp(kind), target_dtype='float16', emulate=True,
                 loss_scaler=DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=100))
    for name, value in _train_three_steps(f16, x, y).items():
        if name not in start:
            continue
        move = np.abs(plain[name] - start[name].asnumpy()).max()
        assert move > 1e-2, name
        # measured over seeds 0-5: 2.5e-4 to 7.4e-4 of the move, 2e-2 to 7.4e-2 where a unit
        # sits at its ReLU kink; unscaled (the old Module) the error is the whole move
        assert np.abs(value - plain[name]).max() <= 0.1 * move, name
    assert f16.skipped_steps == 0 and f16.loss_scale == 2.0 ** 8


def test_get_params_reads_aux_states_after_the_backward_that_writes_them():
    """MXNet's IdentityAttachKLSparseReg (as CPU BatchNorm) writes its aux state in the backward
    pass without the engine ordering later reads after that write. With the head gradient still
    being computed, plain mx.mod.Module.get_params() returns the moving average from before the
    backward (measured: every time); mxmp.Module.get_params() returns the one after it."""
    data = mx.sym.var('data')
    hidden = mx.sym.sigmoid(mx.sym.FullyConnected(data, num_hidden=16, name='fc'))
    sym = mx.sym.IdentityAttachKLSparseReg(hidden, sparseness_target=0.1, penalty=0.5,
                                           name='sparse')
    x = np.random.RandomState(0).randn(8, FEATURES).astype(np.float32)
    for scaler in (StaticLossScaler(2.0 ** 10), 'none'):
        mod = Module(sym, label_names=None, target_dtype='float32', loss_scaler=scaler)
        mod.bind(data_shapes=[('data', (8, FEATURES))])
        mod.init_params(arg_params=module_initial_params(sym, batch=8),
                        aux_params={'sparse_moving_avg': nd.full((16,), 0.1)})
        mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .5})
        mod.forward(mx.io.DataBatch(data=[nd.array(x)]), is_train=True)
        # a head gradient the engine is still computing when get_params() is called
        slow = nd.ones((400, 400))
        for _ in range(8):
            slow = nd.dot(slow, slow) / 400
        mod.backward(out_grads=[slow[:8, :16] * 1e-3])
        mod.update()
        got = mod.get_params()[1]['sparse_moving_avg'].asnumpy()
        nd.waitall()
        written = mod._exec_group.execs[0].aux_dict['sparse_moving_avg'].asnumpy()
        assert np.abs(written - 0.1).min() > 1e-2, scaler        # the backward moved it
        np.testing.assert_array_equal(got, written, err_msg=str(scaler))


def test_output_of_an_opaque_op_takes_its_out_grad_unscaled():
    """A graph output made by a bracketed op: its out_grad enters unscaled (the scale node in
    front of the op scales what its backward returns), input gradients as plain MXNet."""
    data = mx.sym.var('data')
    sym = mx.sym.Custom(mx.sym.FullyConnected(data, num_hidden=3, name='fc'),
                        op_type='mxmp_test_l2_attached', name='penalty')
    x = np.random.RandomState(0).randn(8, FEATURES).astype(np.float32)
    head_grad = nd.array(np.random.RandomState(1).randn(8, 3))
    results = []
    for mod in (mx.mod.Module(sym, label_names=None),
                Module(sym, label_names=None, target_dtype='float32',
                       loss_scaler=StaticLossScaler(2.0 ** 10))):
        mod.bind(data_shapes=[('data', (8, FEATURES))], inputs_need_grad=True)
        mod.init_params(arg_params=module_initial_params(sym, batch=8), aux_params={})
        mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .5})
        mod.forward(mx.io.DataBatch(data=[nd.array(x)]), is_train=True)
        mod.backward(out_grads=[head_grad])
        results.append((mod.get_input_grads()[0].asnumpy(), mod.update(), np_params(mod)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert results[1][1] is True
    for name, value in results[0][2].items():
        np.testing.assert_array_equal(value, results[1][2][name])


def test_opaque_op_in_low_precision_refuses_loss_scaling_naming_the_fix():
    policy = mxmp.Policy('float16', lp_ops=['Custom'], emulate=False)
    converted = mxmp.convert_symbol(opaque_mlp('custom_penalty'), policy=policy,
                                    data_names=['data', 'softmax_label'])
    with pytest.raises(ValueError, match=r"Custom 'penalty'.*float16.*"
                                         r"fp32_ops.*loss_scaler='none'"):
        insert_loss_scale(converted)


# ---------------------------------------------------------------------------- devices, scales
#: The ops that take several arrays at once: MXNet runs each on the context of its output, and
#: on GPUs without peer access an input from another device is an illegal memory access.
MULTI_ARRAY_OPS = ('multi_all_finite', 'concat', 'multi_sgd_update', 'multi_sgd_mom_update',
                   'multi_mp_sgd_update', 'multi_mp_sgd_mom_update', 'elemwise_add', 'add_n')


@pytest.mark.parametrize('kvstore', ['local', 'device', None])
def test_multi_array_ops_get_inputs_from_one_context(monkeypatch, kvstore):
    """Issue 36 item 2: on [cpu(0), cpu(1)] every multi-array call of an update, an overflow
    and the forward check after it, reads arrays of one context only."""
    mixed = []

    def checked(name, fn):
        def call(*args, **kwargs):
            arrays = [a for a in args if isinstance(a, nd.NDArray)]
            out = kwargs.get('out')
            arrays += [o for o in (out if isinstance(out, (list, tuple)) else [out])
                       if isinstance(o, nd.NDArray)]
            if len({str(a.context) for a in arrays}) > 1:
                mixed.append((name, [str(a.context) for a in arrays]))
            return fn(*args, **kwargs)
        return call

    for name in MULTI_ARRAY_OPS:
        monkeypatch.setattr(nd, name, checked(name, getattr(nd, name)))
    x, y = problem(2 * MODULE_BATCH)
    mod = Module(mlp(), context=TWO_CPUS, target_dtype='float16', emulate=True,
                 loss_scaler=DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=100))
    mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
             label_shapes=[('softmax_label', (MODULE_BATCH,))])
    mod.init_params(arg_params=module_initial_params(), aux_params={})
    mod.init_optimizer(kvstore=kvstore, optimizer='sgd',
                       optimizer_params={'learning_rate': .1, 'momentum': .9})
    assert step(mod, x[:MODULE_BATCH], y[:MODULE_BATCH])
    bad = x[MODULE_BATCH:].copy()
    bad[-1, 0] = np.inf   # on cpu(1): the forward check runs, with outputs on both
    with pytest.warns(mxmp.NonFiniteForwardWarning):
        assert step(mod, bad, y[MODULE_BATCH:]) is False
    assert mixed == []


def test_input_gradients_use_the_scale_of_their_backward_as_plain_mxnet():
    """Issue 36 item 6: get_input_grads() after an update() that grew the scale returns the
    same values as before it, and as plain MXNet."""
    x, y = problem(MODULE_BATCH, seed=2)
    grads = []
    for mod in (mx.mod.Module(mlp()),
                Module(mlp(), target_dtype='float32',
                       loss_scaler=DynamicLossScaler(init_scale=2.0 ** 6, growth_interval=1))):
        mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
                 label_shapes=[('softmax_label', (MODULE_BATCH,))], inputs_need_grad=True)
        mod.init_params(arg_params=module_initial_params(), aux_params={})
        mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': .1})
        mod.forward_backward(batch_of(x, y))
        before = mod.get_input_grads()[0].asnumpy()
        per_ctx = mod.get_input_grads(merge_multi_context=False)[0][0].asnumpy()
        mod.update()
        grads.append((before, per_ctx, mod.get_input_grads()[0].asnumpy()))
    assert mod.loss_scale == 2.0 ** 7   # the update changed the scale
    assert np.abs(grads[0][0]).max() > 0
    for got in grads[1]:
        np.testing.assert_array_equal(got, grads[0][0])


@pytest.mark.parametrize('data_dtype', ['float32', 'float16'])
def test_float16_head_and_input_gradients_at_the_default_scale_train_as_plain_mxnet(data_dtype):
    """float16 out_grads given to backward() and float16 input gradients (a float16 data
    input) meet the default loss scale 2**16, inf in float16: MXNet converts a Python number
    to the array's dtype, so ``g * 2**16`` was inf (NaN input gradients, the step skipped and
    the scale backed off) and ``g / 2**16`` was 0. Scaled and unscaled in float32: plain
    MXNet's float32 numbers (same float16 out_grads) within float16 rounding, the gradients
    in the data's dtype, the step taken at 2**16."""
    data = mx.sym.var('data')
    sym = mx.sym.FullyConnected(data, num_hidden=3, name='fc')
    rng = np.random.RandomState(0)
    x = rng.randn(8, FEATURES).astype(np.float16)
    head = nd.array(rng.randn(8, 3) * 1e-2, dtype='float16')
    results = []
    for mod, dtype in ((mx.mod.Module(sym, label_names=None), 'float32'),
                       (Module(sym, label_names=None, target_dtype='float16', emulate=True),
                        data_dtype)):
        mod.bind(data_shapes=[mx.io.DataDesc('data', (8, FEATURES), dtype=dtype)],
                 inputs_need_grad=True)
        mod.init_params(arg_params=module_initial_params(sym, batch=8), aux_params={})
        mod.init_optimizer(optimizer='sgd', optimizer_params={'learning_rate': 1.0})
        mod.forward(mx.io.DataBatch(data=[nd.array(x, dtype=dtype)]), is_train=True)
        mod.backward(out_grads=[head])
        grads = [mod.get_input_grads()[0], mod.get_input_grads(merge_multi_context=False)[0][0]]
        results.append((grads, mod.update(), np_params(mod)))
    assert mod.loss_scale == 2.0 ** 16 and mod.skipped_steps == 0 and results[1][1] is True
    reference = results[0][0][0].asnumpy()
    start = module_initial_params(sym, batch=8)
    for got in results[1][0]:
        assert got.dtype == np.dtype(data_dtype)
        # measured over seeds 0-5: 1.8e-4 to 5.3e-4 of the largest (float16's unit roundoff
        # is 4.9e-4); the old Module: NaN with float16 out_grads, 0 from a float16 gradient
        error = np.abs(got.asnumpy().astype(np.float64) - reference).max()
        assert error <= 2e-3 * np.abs(reference).max()
    for name, value in results[0][2].items():
        move = np.abs(value - start[name].asnumpy()).max()
        assert move > 1e-3, name
        # measured over seeds 0-5: 2.2e-4 to 3.7e-4 of the move
        assert np.abs(results[1][2][name] - value).max() <= 2e-3 * move, name


# ---------------------------------------------------------------------------- checkpoint choices
def _gpu_has_float16_kernels(monkeypatch):
    """This process as a machine whose gpu(0) runs float16 kernels (the probe is the only
    thing that tells; nothing here binds on the GPU)."""
    import mxmp._src.device as device
    real = device.lp_kernels_available
    monkeypatch.setattr(device, 'lp_kernels_available', lambda dtype, ctx=None: (
        ctx is not None and ctx.device_type == 'gpu') or real(dtype, ctx))


def test_checkpoint_stores_the_users_emulate_not_this_machines(tmp_path, monkeypatch):
    """Issue 36 item 3: a float16 checkpoint written here (emulated: no float16 kernels on a
    CPU) resumes on a GPU with its kernels, and a GPU checkpoint resumes here emulated."""
    prefix = str(tmp_path / 'f16')
    x, y = problem(MODULE_BATCH)
    mod = ready(Module(mlp(), target_dtype='float16',    # emulate='auto'
                       loss_scaler=DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=9)))
    assert mod.policy.emulate is True and step(mod, x, y)
    mod.save_checkpoint(prefix, 1, save_optimizer_states=True)
    _gpu_has_float16_kernels(monkeypatch)
    on_gpu = Module.load(prefix, 1, context=mx.gpu(0))
    assert on_gpu.policy.emulate is False and on_gpu.target_dtype == 'float16'
    assert json.load(open(prefix + '-0001.mxmp.json'))['policy']['emulate'] == 'auto'
    assert mxmp.count_casts(on_gpu.mxmp_symbol)['amp_cast'] > 0
    # the JSON a GPU run writes, resumed on this CPU: emulated, no error
    state = Module(mlp(), target_dtype='float16', context=mx.gpu(0)).mixed_precision_state()
    state['loss_scaler'] = mod.loss_scaler.state_dict()
    monkeypatch.undo()
    with open(prefix + '-0001.mxmp.json', 'w') as out:
        json.dump(state, out)
    back = ready(Module.load(prefix, 1, load_optimizer_states=True))
    assert back.policy.emulate is True and back.loss_scale == mod.loss_scale
    assert step(back, x, y) and step(mod, x, y)
    for name, value in np_params(mod).items():
        np.testing.assert_array_equal(np_params(back)[name], value)
    explicit = Module.load(prefix, 1, emulate=True)   # a shorthand still wins
    assert explicit.policy.emulate is True


def test_checkpoint_loads_under_an_agreeing_policy_and_keeps_the_op_lists(tmp_path):
    """Issue 36 item 4: the policy's op lists are in the JSON; a policy whose loss scaler is
    'dynamic' loads the saved dynamic scaler's state; one of another kind is refused."""
    prefix = str(tmp_path / 'pol')
    x, y = problem(2 * MODULE_BATCH)
    policy = mxmp.Policy('float16', fp32_ops=['Activation'], loss_scaler='dynamic',
                         emulate=True)
    mod = ready(Module(mlp(), policy=policy))
    applied = [step(mod, x[MODULE_BATCH:], y[MODULE_BATCH:]) for _ in range(6)]
    assert applied[-1] and mod.skipped_steps == applied.index(True) >= 1   # 2**16 overflows
    scale = mod.loss_scale
    assert scale == 2.0 ** (16 - mod.skipped_steps)
    mod.save_checkpoint(prefix, 2)
    for kwargs in ({'policy': policy}, {}):
        back = Module.load(prefix, 2, **kwargs)
        assert back.policy.fp32_ops == frozenset(['Activation'])
        assert back.loss_scale == scale and back.skipped_steps == mod.skipped_steps
        assert back.mxmp_symbol.tojson(remove_amp_cast=False) == \
            mod.mxmp_symbol.tojson(remove_amp_cast=False)
    assert json.load(open(prefix + '-0002.mxmp.json'))['policy']['fp32_ops'] == ['Activation']
    with pytest.raises(ValueError, match="DynamicLossScaler but the policy asks for "
                                         "loss_scaler='static'"):
        Module.load(prefix, 2, policy=policy.replace(loss_scaler='static'))


def logits_and_loss():
    """A softmax loss and its logits (a low-precision FullyConnected) as a second output."""
    data = mx.sym.var('data')
    h = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=16, name='fc1'),
                          act_type='relu', name='relu1')
    logits = mx.sym.FullyConnected(h, num_hidden=CLASSES, name='logits')
    return mx.sym.Group([mx.sym.SoftmaxOutput(logits, name='softmax'), logits])


def test_non_loss_outputs_keep_the_symbols_names_for_metrics(tmp_path):
    """Issue 36 item 9: a float16 output keeps its name ('logits_output', not the cast's), so
    metrics that pick outputs by name work as with mx.mod.Module, also after a checkpoint
    written with its casts."""
    x, y = problem(2 * MODULE_BATCH, seed=6)
    scores = []
    for mod in (mx.mod.Module(logits_and_loss()),
                Module(logits_and_loss(), target_dtype='float16', emulate=True)):
        ready(mod, params=module_initial_params(logits_and_loss()))
        assert mod.output_names == ['softmax_output', 'logits_output']
        metric = mx.metric.Accuracy(output_names=['logits_output'],
                                    label_names=['softmax_label'])
        scores.append(dict(mod.score(mx.io.NDArrayIter(x, y, batch_size=MODULE_BATCH),
                                     metric))['accuracy'])
    assert scores[0] == scores[1] and 0 < scores[0] < 1
    assert mod.mxmp_symbol.list_outputs() == ['softmax_output', 'logits_output']
    prefix = str(tmp_path / 'named')
    mod.save_checkpoint(prefix, 1, remove_amp_cast=False)
    graph = json.load(open(prefix + '-symbol.json'))
    assert 'amp_cast' in {n['op'] for n in graph['nodes']}
    assert mx.sym.load(prefix + '-symbol.json').list_outputs() == mod.output_names
    back = Module.load(prefix, 1)
    assert back.symbol.list_outputs() == back.output_names == mod.output_names
    assert back.symbol.tojson() == logits_and_loss().tojson()


def _weight_bytes(mod):
    """Bytes of the parameters the executors hold, and of mxmp's float32 masters."""
    group = mod._exec_group
    held = sum(a.size * np.dtype(a.dtype).itemsize for arrays in group.param_arrays
               for a in arrays)
    masters = getattr(mod, '_masters', None)
    extra = 0 if masters is None else sum(
        a.size * 4 for arrays in masters._masters.values() for a in arrays)
    return held, extra


def test_inference_bind_with_cast_params_holds_one_low_precision_copy_of_each_weight():
    """Issue 36 item 7: an inference-only bind keeps no float32 masters: its weights take half
    of plain MXNet's float32 bytes (measured here: masters were 1.5x float32 before), its
    outputs are those of the trained Module's float16 weights, and a training re-bind gets its
    masters back from the float32 host parameters."""
    x, y = problem(MODULE_BATCH, seed=8)
    plain = mx.mod.Module(mlp())
    plain.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))], for_training=False)
    plain.init_params(arg_params=module_initial_params(), aux_params={})
    plain_bytes, _ = _weight_bytes(plain)
    mod = Module(mlp(), target_dtype='float16', emulate=True, cast_params=True)
    mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))], for_training=False)
    mod.init_params(arg_params=module_initial_params(), aux_params={})
    assert mod._masters.lp_names == {'fc1_weight', 'fc1_bias', 'fc2_weight', 'fc2_bias'}
    held, masters = _weight_bytes(mod)
    assert (held, masters) == (plain_bytes // 2, 0)
    with pytest.raises(ValueError, match='inference-only bind.*get_params'):
        mod.master_weights('fc1_weight')
    for m in (plain, mod):
        m.forward(mx.io.DataBatch(data=[nd.array(x)]), is_train=False)
    np.testing.assert_allclose(mod.get_outputs()[0].asnumpy(), plain.get_outputs()[0].asnumpy(),
                               atol=2e-3)
    for name, value in module_initial_params().items():
        np.testing.assert_array_equal(np_params(mod)[name], value.asnumpy())
    mod.bind(data_shapes=[('data', (MODULE_BATCH, FEATURES))],
             label_shapes=[('softmax_label', (MODULE_BATCH,))], force_rebind=True)
    assert mod._exec_group.param_arrays[0][0].dtype == np.float16
    for name, value in module_initial_params().items():
        np.testing.assert_array_equal(mod.master_weights(name)[0].asnumpy(), value.asnumpy())


def test_checkpoint_loads_with_loss_scaler_named_by_kind(tmp_path):
    """loss_scaler='dynamic' agrees with a saved DynamicLossScaler of any configuration: its
    state comes back; a LossScaler of another configuration is still refused (above)."""
    prefix = str(tmp_path / 'kind')
    x, y = problem(MODULE_BATCH)
    mod = ready(Module(mlp(), target_dtype='float16', emulate=True,
                       loss_scaler=DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=1)))
    assert step(mod, x, y) and mod.loss_scale == 2.0 ** 9
    mod.save_checkpoint(prefix, 1)
    back = Module.load(prefix, 1, loss_scaler='dynamic')
    assert back.loss_scaler == mod.loss_scaler and back.loss_scaler.growth_interval == 1
    with pytest.raises(ValueError, match="is for 'DynamicLossScaler' but this scaler is "
                                         "'StaticLossScaler'"):
        Module.load(prefix, 1, loss_scaler='static')


def test_an_op_no_list_knows_is_bracketed_like_a_custom_op(monkeypatch):
    """An op of an operator library (mx.library.load) is in no op list: its backward may add a
    gradient of its own, so it is bracketed too. Stood in for by IdentityAttachKLSparseReg
    taken out of every list (and out of OPAQUE_GRADIENT_OPS): still plain MXNet's step."""
    from mxmp._src.graph import loss_heads
    from mxmp._src.policy import policy as policy_module
    hidden = 'IdentityAttachKLSparseReg'
    real = policy_module._effective_classes
    monkeypatch.setattr(policy_module, '_effective_classes', lambda *args: {
        name: ops - {hidden} for name, ops in real(*args).items()})
    monkeypatch.setattr(loss_heads, 'OPAQUE_GRADIENT_OPS',
                        loss_heads.OPAQUE_GRADIENT_OPS - {hidden})
    assert hidden in loss_heads.opaque_ops(opaque_mlp('kl_sparse'), None)
    x, y = problem(3 * MODULE_BATCH, seed=4)
    plain = _train_three_steps(mx.mod.Module(opaque_mlp('kl_sparse')), x, y)
    mod = Module(opaque_mlp('kl_sparse'), target_dtype='float32',
                 loss_scaler=StaticLossScaler(2.0 ** 10))
    for name, value in _train_three_steps(mod, x, y).items():
        np.testing.assert_array_equal(value, plain[name], err_msg=name)
