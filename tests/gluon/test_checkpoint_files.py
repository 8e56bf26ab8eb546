"""Checkpoints of a converted block: each parameter once, the original's names, float32.

``save_parameters`` of a converted network writes what ``net.save_parameters`` of the float32 network
writes (same keys, float32 values); a float32 file loads into the converted block and the
converted block's file into the float32 network; a Trainer's master weights are what is saved.
"""
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd

import mxmp
from mxmp._src.block_params import ParameterFileError

EMULATE_BF16 = not mxmp.lp_kernels_available('bfloat16')
# (target dtype, emulate): float16 has no CPU GEMM, so it is always emulated here.
MODES = [('bfloat16', EMULATE_BF16), ('float16', True)]


def small_net(seed=0):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3), gluon.nn.BatchNorm(), gluon.nn.Activation('relu'),
            gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(data())       # finish the deferred initialization
    return net


def data(seed=1):
    return nd.array(np.random.RandomState(seed).uniform(-1, 1, (2, 3, 8, 8)))


def float32_file(tmp_path, seed=0):
    net = small_net(seed)
    out = net(data()).asnumpy()
    path = str(tmp_path / ('f32-%d.params' % seed))
    net.save_parameters(path)
    return path, out


def lp_tolerance(dtype):
    # 8 (bfloat16) or 11 (float16) significant bits in weights and activations of 3 layers
    return 0.05 if dtype == 'bfloat16' else 0.01


@pytest.mark.parametrize('dtype,emulate', MODES)
@pytest.mark.parametrize('cast_params', [False, True])
def test_saved_file_is_the_float32_networks_file(tmp_path, dtype, emulate, cast_params):
    f32_path, _ = float32_file(tmp_path)
    net = small_net()
    reference = {k: v.data().asnumpy() for k, v in net._collect_params_with_prefix().items()}
    conv = mxmp.convert(net, dtype, cast_params=cast_params, emulate=emulate)
    conv(data())
    path = str(tmp_path / 'conv.params')
    conv.save_parameters(path)
    saved = nd.load(path)
    assert sorted(saved) == sorted(nd.load(f32_path))          # same keys, each once
    assert all(v.dtype == np.float32 for v in saved.values())
    assert os.path.getsize(path) == os.path.getsize(f32_path)
    for key, value in saved.items():
        if cast_params and key in ('0.weight', '0.bias', '3.weight', '3.bias'):
            # stored in the target dtype: the file holds the rounding, widened exactly
            np.testing.assert_allclose(value.asnumpy(), reference[key], rtol=2.0 ** -7)
        else:   # float32 parameters (BatchNorm's stay float32 always): bit for bit
            np.testing.assert_array_equal(value.asnumpy(), reference[key])


@pytest.mark.parametrize('dtype,emulate', MODES)
@pytest.mark.parametrize('cast_params', [False, True])
def test_files_load_both_ways(tmp_path, dtype, emulate, cast_params):
    f32_path, f32_out = float32_file(tmp_path, seed=0)
    other = small_net(seed=5)                     # other values, same architecture
    conv = mxmp.convert(other, dtype, cast_params=cast_params, emulate=emulate)
    conv.load_parameters(f32_path)
    got = conv(data()).asnumpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, f32_out, atol=lp_tolerance(dtype) * np.abs(f32_out).max())
    if cast_params:
        w = conv.collect_params()[other[0].weight.name]
        assert mxmp._src.dtypes.dtype_name(w.dtype) == dtype      # still stored in the target dtype

    back = str(tmp_path / 'back.params')
    conv.save_parameters(back)
    plain = small_net(seed=9)
    plain.load_parameters(back)                   # plain Gluon, no mxmp involved
    got32 = plain(data()).asnumpy()
    if cast_params:   # the weights went through the target dtype once
        np.testing.assert_allclose(got32, f32_out,
                                   atol=lp_tolerance(dtype) * np.abs(f32_out).max())
    else:             # float32 weights all the way: exact
        np.testing.assert_array_equal(got32, f32_out)


def test_trainer_master_weights_are_saved_and_restored(tmp_path):
    dtype, emulate = MODES[0]
    net = small_net()
    conv = mxmp.convert(net, dtype, cast_params=True, emulate=emulate)
    trainer = mxmp.Trainer(conv.collect_params(), 'sgd', {'learning_rate': 0.1})
    x = data()
    for _ in range(2):
        with autograd.record():
            loss = conv(x).square().sum()
        loss.backward()
        trainer.step(2)
    weight = conv.collect_params()[net[0].weight.name]
    master = trainer.master_weights(weight)[0].asnumpy()
    stored = nd.amp_cast(weight.data(), dtype='float32').asnumpy()
    assert not np.array_equal(master, stored)     # the stored weight is a rounding of it
    path = str(tmp_path / 'trained.params')
    conv.save_parameters(path)
    np.testing.assert_array_equal(nd.load(path)['0.weight'].asnumpy(), master)

    f32_path, _ = float32_file(tmp_path, seed=3)
    conv.load_parameters(f32_path)                # the masters become the file's values
    np.testing.assert_array_equal(trainer.master_weights(weight)[0].asnumpy(),
                                  nd.load(f32_path)['0.weight'].asnumpy())


def test_deduplicate_allow_missing_ignore_extra_as_gluon(tmp_path):
    class Tied(gluon.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.a = gluon.nn.Dense(4, in_units=4)
                self.b = gluon.nn.Dense(4, in_units=4, params=self.a.params)

        def hybrid_forward(self, F, x):
            return self.b(F.relu(self.a(x)))

    net = Tied()
    net.initialize()
    x = nd.ones((2, 4))
    conv = mxmp.convert(net, 'bfloat16', emulate=True)
    full, dedup = str(tmp_path / 'full.params'), str(tmp_path / 'dedup.params')
    conv.save_parameters(full)
    conv.save_parameters(dedup, deduplicate=True)
    net.save_parameters(str(tmp_path / 'gluon.params'), deduplicate=True)
    assert sorted(nd.load(full)) == ['a.bias', 'a.weight', 'b.bias', 'b.weight']
    assert sorted(nd.load(dedup)) == sorted(nd.load(str(tmp_path / 'gluon.params')))
    conv.load_parameters(dedup)                   # a shared parameter needs one of its names
    np.testing.assert_allclose(conv(x).asnumpy(), net(x).asnumpy(), rtol=0.02, atol=0.02)

    nd.save(str(tmp_path / 'part.params'), {'a.weight': nd.ones((4, 4))})
    with pytest.raises(AssertionError, match="'a.bias' is missing.*allow_missing=True"):
        conv.load_parameters(str(tmp_path / 'part.params'))
    with pytest.raises(ValueError, match='missing'):
        conv.load_parameters(str(tmp_path / 'part.params'))
    conv.load_parameters(str(tmp_path / 'part.params'), allow_missing=True)
    np.testing.assert_array_equal(net.a.weight.data().asnumpy(), np.ones((4, 4)))

    extra = dict(nd.load(full), **{'c.weight': nd.ones((1,))})
    nd.save(str(tmp_path / 'extra.params'), extra)
    with pytest.raises(ParameterFileError, match="'c.weight'.*ignore_extra=True"):
        conv.load_parameters(str(tmp_path / 'extra.params'))
    conv.load_parameters(str(tmp_path / 'extra.params'), ignore_extra=True)
    with pytest.raises(FileNotFoundError):
        conv.load_parameters(str(tmp_path / 'nope.params'))
    with pytest.raises(ValueError, match="dtype_source='current'"):
        conv.load_parameters(full, dtype_source='saved')


def test_ctx_and_deferred_initialization(tmp_path):
    f32_path, f32_out = float32_file(tmp_path)
    net = gluon.nn.HybridSequential()             # not initialized: shapes come from the file
    net.add(gluon.nn.Conv2D(4, 3), gluon.nn.BatchNorm(), gluon.nn.Activation('relu'),
            gluon.nn.Dense(3))
    conv = mxmp.convert(net, 'bfloat16', cast_params=True, emulate=EMULATE_BF16)
    conv.load_parameters(f32_path, ctx=mx.cpu(0))
    w = conv.collect_params()[net[0].weight.name]
    assert w.list_ctx() == [mx.cpu(0)]
    np.testing.assert_allclose(conv(data()).asnumpy(), f32_out,
                               atol=0.05 * np.abs(f32_out).max())
    assert mxmp._src.dtypes.dtype_name(w.dtype) == 'bfloat16'   # cast when the graph was built


def test_export_files_load(tmp_path):
    f32_path, _ = float32_file(tmp_path)
    net = small_net(seed=4)
    conv = mxmp.convert(net, 'bfloat16', emulate=EMULATE_BF16)
    conv.load_parameters(f32_path)
    conv.hybridize()
    conv(data())
    before = conv(data()).asnumpy()
    conv.export(str(tmp_path / 'exp'))            # keys 'arg:conv0_weight', 'aux:...'
    for param in conv.collect_params().values():
        param.set_data(nd.zeros(param.shape))
    conv.load_parameters(str(tmp_path / 'exp-0000.params'))
    np.testing.assert_array_equal(conv(data()).asnumpy(), before)


def test_bad_dtype_is_refused(tmp_path):
    conv = mxmp.convert(small_net(), 'bfloat16', emulate=True)
    with pytest.raises(ValueError, match='float16'):
        conv.save_parameters(str(tmp_path / 'x.params'), dtype='int8')
    conv.save_parameters(str(tmp_path / 'half.params'), dtype='bfloat16')
    assert all(mxmp._src.dtypes.dtype_name(v.dtype) == 'bfloat16'
               for v in nd.load(str(tmp_path / 'half.params')).values())


@pytest.mark.parametrize('cast_params', [False, True])
def test_resnet18_file_has_the_float32_size(tmp_path, cast_params):
    from gluoncv.model_zoo import get_model
    net = get_model('resnet18_v1')
    net.initialize(mx.init.Xavier())
    x = nd.array(np.random.RandomState(0).uniform(-1, 1, (1, 3, 32, 32)))
    net(x)
    f32 = str(tmp_path / 'f32.params')
    net.save_parameters(f32)
    conv = mxmp.convert(net, 'bfloat16', cast_params=cast_params, emulate=EMULATE_BF16)
    path = str(tmp_path / 'conv.params')
    conv.save_parameters(path)
    assert os.path.getsize(path) == os.path.getsize(f32)       # 44.8 MB, not twice that
    assert 40e6 < os.path.getsize(path) < 50e6
    assert sorted(nd.load(path)) == sorted(nd.load(f32))
    plain = get_model('resnet18_v1')
    plain.load_parameters(path)
    conv2 = mxmp.convert(get_model('resnet18_v1'), 'bfloat16', cast_params=cast_params,
                         emulate=EMULATE_BF16)
    conv2.load_parameters(f32)
