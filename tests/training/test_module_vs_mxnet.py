"""mxmp.Module against mx.mod.Module, the MXNet piece it wraps: float32 bit for bit (also with a
loss scale: powers of two scale and unscale exactly), float16 (emulated on CPU) within its
rounding; fit, forward/backward/update, outputs, input gradients, metrics by output name,
several contexts with each kvstore, checkpoints and optimizer states in both directions.
Tiny MLPs: the whole file runs in seconds."""
import numpy as np
import pytest
import mxnet as mx
from mxnet import nd

from mxmp._src.training.module import Module
from mxmp._src.scaling import DynamicLossScaler, StaticLossScaler
from helpers import CLASSES, FEATURES, MODULE_BATCH, batch_of, module_initial_params, np_params, problem  # noqa: E402

TWO_CPUS = [mx.cpu(0), mx.cpu(1)]


def mlp():
    """The MLP of the other Module tests with tanh for ReLU: float16 and float32 then differ by
    rounding alone (with ReLU a unit whose input rounds across 0 flips its whole gradient)."""
    data = mx.sym.var('data')
    h = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=16, name='fc1'),
                          act_type='tanh', name='tanh1')
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(h, num_hidden=CLASSES, name='fc2'),
                                name='softmax')
BATCH = 2 * MODULE_BATCH
#: float16 (emulated) against float32 over three SGD steps, one, two contexts (kvstore 'local'
#: and None), seeds 0-5: input gradients and parameter moves differ by at most 1.1e-3 of their
#: largest value (typically 5e-4: float16 keeps 11 significant bits); outputs (probabilities)
#: by at most 5.6e-4.
FLOAT16_TOLERANCE = 4e-3
FLOAT16_OUTPUT_ATOL = 2e-3


def float32_module(ctx):
    """An mxmp float32 Module whose scale (2**10, static) makes every gradient pass through
    the loss-scale node and rescale_grad: still plain MXNet's numbers, bit for bit."""
    return Module(mlp(), context=ctx, target_dtype='float32',
                  loss_scaler=StaticLossScaler(2.0 ** 10))


def float16_module(ctx):
    return Module(mlp(), context=ctx, target_dtype='float16', emulate=True,
                  loss_scaler=DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=1000))


def prepare(mod, kvstore='local', inputs_need_grad=False, momentum=.9):
    mod.bind(data_shapes=[('data', (BATCH, FEATURES))],
             label_shapes=[('softmax_label', (BATCH,))], inputs_need_grad=inputs_need_grad)
    mod.init_params(arg_params=module_initial_params(batch=BATCH), aux_params={})
    mod.init_optimizer(kvstore=kvstore, optimizer='sgd',
                       optimizer_params={'learning_rate': .1, 'momentum': momentum})
    return mod


def assert_close_to(params, reference, start, tolerance):
    """Each parameter within ``tolerance`` of its largest move from ``start`` (0: equal)."""
    for name, value in reference.items():
        if tolerance == 0:
            np.testing.assert_array_equal(params[name], value, err_msg=name)
            continue
        move = np.abs(value - start[name].asnumpy()).max()
        assert move > 1e-3, name
        assert np.abs(params[name] - value).max() <= tolerance * move, name


CONTEXTS = [pytest.param(mx.cpu(0), 'local', id='one-context'),
            pytest.param(TWO_CPUS, 'local', id='two-contexts-local'),
            pytest.param(TWO_CPUS, 'device', id='two-contexts-device'),
            pytest.param(TWO_CPUS, None, id='two-contexts-no-kvstore')]


@pytest.mark.parametrize('ctx, kvstore', CONTEXTS)
def test_fit_and_score_as_mx_mod_module(ctx, kvstore):
    """fit() for 2 epochs, then score() with a metric picked by output name."""
    x, y = problem(4 * BATCH, seed=2)
    results = []
    for make in (lambda: mx.mod.Module(mlp(), context=ctx), lambda: float32_module(ctx),
                 lambda: float16_module(ctx)):
        mod = make()
        mod.fit(mx.io.NDArrayIter(x, y, batch_size=BATCH), num_epoch=2, kvstore=kvstore,
                arg_params=module_initial_params(batch=BATCH), aux_params={},
                optimizer='sgd', optimizer_params={'learning_rate': .1, 'momentum': .9})
        metric = mx.metric.Accuracy(output_names=['softmax_output'],
                                    label_names=['softmax_label'])
        score = dict(mod.score(mx.io.NDArrayIter(x, y, batch_size=BATCH), metric))
        results.append((np_params(mod), score['accuracy']))
    (plain, acc), (f32, acc32), (f16, acc16) = results
    start = module_initial_params(batch=BATCH)
    assert_close_to(f32, plain, start, 0)
    assert acc32 == acc and 0.3 < acc
    assert_close_to(f16, plain, start, FLOAT16_TOLERANCE)
    assert abs(acc16 - acc) <= 2.0 / len(y)


@pytest.mark.parametrize('ctx, kvstore', CONTEXTS)
def test_forward_backward_update_outputs_and_input_gradients_as_mx_mod_module(ctx, kvstore):
    """Three forward/backward/update steps; outputs (merged and per context), input gradients
    and parameters after each."""
    x, y = problem(3 * BATCH, seed=3)
    runs = []
    for mod in (mx.mod.Module(mlp(), context=ctx), float32_module(ctx), float16_module(ctx)):
        prepare(mod, kvstore, inputs_need_grad=True)
        seen = []
        for k in range(3):
            mod.forward(batch_of(x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]),
                        is_train=True)
            mod.backward()
            seen.append((mod.get_outputs()[0].asnumpy(),
                         [o.asnumpy() for o in mod.get_outputs(merge_multi_context=False)[0]],
                         mod.get_input_grads()[0].asnumpy()))
            assert mod.update() is not False
        runs.append((seen, np_params(mod)))
    (plain, plain_params), (f32, f32_params), (f16, f16_params) = runs
    for (out, per_ctx, grad), (out32, per_ctx32, grad32), (out16, _, grad16) in zip(plain, f32,
                                                                                   f16):
        np.testing.assert_array_equal(out32, out)
        for a, b in zip(per_ctx32, per_ctx):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(grad32, grad)
        np.testing.assert_allclose(out16, out, atol=FLOAT16_OUTPUT_ATOL)
        assert np.abs(grad16 - grad).max() <= FLOAT16_TOLERANCE * np.abs(grad).max()
    start = module_initial_params(batch=BATCH)
    assert_close_to(f32_params, plain_params, start, 0)
    assert_close_to(f16_params, plain_params, start, FLOAT16_TOLERANCE)


def _train(mod, x, y, steps):
    for k in range(steps):
        mod.forward_backward(batch_of(x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]))
        mod.update()


# kvstore None on two contexts is left out: each context trains its own copy there and a
# checkpoint holds the first one's, so not even plain MXNet resumes where it stopped.
@pytest.mark.parametrize('ctx, kvstore', CONTEXTS[:3])
def test_plain_mxnet_checkpoint_with_optimizer_states_resumes_in_mxmp(tmp_path, ctx, kvstore):
    """Plain MXNet trains 2 steps and saves parameters and momentum (by parameter name when its
    kvstore updates: several contexts, 'local' or 'device'); mxmp resumes: the next step equals
    plain MXNet's own, bit for bit."""
    x, y = problem(3 * BATCH, seed=1)
    prefix = str(tmp_path / 'plain')
    plain = prepare(mx.mod.Module(mlp(), context=ctx), kvstore)
    _train(plain, x, y, 2)
    plain.save_checkpoint(prefix, 1, save_optimizer_states=True)
    back = Module.load(prefix, 1, load_optimizer_states=True, context=ctx,
                       target_dtype='float32', loss_scaler=StaticLossScaler(2.0 ** 10))
    back.bind(data_shapes=[('data', (BATCH, FEATURES))],
              label_shapes=[('softmax_label', (BATCH,))])
    back.init_optimizer(kvstore=kvstore, optimizer='sgd',
                        optimizer_params={'learning_rate': .1, 'momentum': .9})
    for mod in (plain, back):
        _train(mod, x[2 * BATCH:], y[2 * BATCH:], 1)
    assert_close_to(np_params(back), np_params(plain), None, 0)


def test_mxmp_checkpoint_with_optimizer_states_resumes_in_plain_mxnet(tmp_path):
    """mxmp (float32, and float16 with float32 masters) saves; plain MXNet loads parameters and
    momentum and its next step equals mxmp's."""
    x, y = problem(3 * BATCH, seed=1)
    for make, tolerance in ((lambda: float32_module(mx.cpu(0)), 0),
                            (lambda: Module(mlp(), target_dtype='float16', emulate=True,
                                            cast_params=True,
                                            loss_scaler=StaticLossScaler(2.0 ** 8)),
                             FLOAT16_TOLERANCE)):
        prefix = str(tmp_path / ('mxmp%d' % tolerance))
        mod = prepare(make())
        _train(mod, x, y, 2)
        mod.save_checkpoint(prefix, 1, save_optimizer_states=True)
        plain = mx.mod.Module.load(prefix, 1, load_optimizer_states=True)
        plain.bind(data_shapes=[('data', (BATCH, FEATURES))],
                   label_shapes=[('softmax_label', (BATCH,))])
        plain.init_optimizer(optimizer='sgd',
                             optimizer_params={'learning_rate': .1, 'momentum': .9})
        start = np_params(mod)
        for each in (mod, plain):
            _train(each, x[2 * BATCH:], y[2 * BATCH:], 1)
        assert_close_to(np_params(plain), np_params(mod),
                        {k: nd.array(v) for k, v in start.items()}, tolerance)


def test_metric_by_name_on_a_non_loss_output_as_mx_mod_module():
    """A float16 non-loss output found by its name, as plain MXNet, in update_metric."""
    data = mx.sym.var('data')
    logits = mx.sym.FullyConnected(mx.sym.relu(mx.sym.FullyConnected(
        data, num_hidden=16, name='fc1')), num_hidden=CLASSES, name='fc2')
    sym = mx.sym.Group([mx.sym.SoftmaxOutput(logits, name='softmax'), logits])
    x, y = problem(BATCH, seed=5)
    values = []
    for mod in (mx.mod.Module(sym), Module(sym, target_dtype='float16', emulate=True)):
        mod.bind(data_shapes=[('data', (BATCH, FEATURES))],
                 label_shapes=[('softmax_label', (BATCH,))], for_training=False)
        mod.init_params(arg_params=module_initial_params(sym, batch=BATCH), aux_params={})
        mod.forward(batch_of(x, y), is_train=False)
        metric = mx.metric.TopKAccuracy(top_k=2, output_names=['fc2_output'],
                                        label_names=['softmax_label'])
        mod.update_metric(metric, [nd.array(y)])
        values.append(metric.get()[1])
    assert abs(values[0] - values[1]) <= 1.0 / BATCH and 0 < values[0] < 1


@pytest.mark.parametrize('kvstore', ['local', 'device'])
def test_mxmp_checkpoint_on_two_contexts_resumes_in_plain_mxnet_and_mxmp(tmp_path, kvstore):
    """mxmp on two contexts writes its Adam states and update counts as plain MXNet's kvstore
    does (by parameter name): plain MXNet and mxmp both resume them, and their next step equals
    the step of the run that saved them, bit for bit (Adam's bias correction reads the
    counts)."""
    x, y = problem(3 * BATCH, seed=7)
    prefix = str(tmp_path / 'two')

    def adam(mod):
        mod.init_optimizer(kvstore=kvstore, optimizer='adam',
                           optimizer_params={'learning_rate': .01}, force_init=True)
        return mod
    mod = adam(prepare(float32_module(TWO_CPUS), kvstore))
    _train(mod, x, y, 2)
    mod.save_checkpoint(prefix, 1, save_optimizer_states=True)
    plain = mx.mod.Module.load(prefix, 1, load_optimizer_states=True, context=TWO_CPUS)
    back = Module.load(prefix, 1, load_optimizer_states=True, context=TWO_CPUS,
                       target_dtype='float32', loss_scaler=StaticLossScaler(2.0 ** 10))
    for each in (plain, back):
        each.bind(data_shapes=[('data', (BATCH, FEATURES))],
                  label_shapes=[('softmax_label', (BATCH,))])
        adam(each)
    for each in (mod, plain, back):
        _train(each, x[2 * BATCH:], y[2 * BATCH:], 1)
    assert_close_to(np_params(plain), np_params(mod), None, 0)
    assert_close_to(np_params(back), np_params(mod), None, 0)
