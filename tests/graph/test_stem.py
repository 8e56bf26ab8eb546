"""mxmp._src.graph.stem: the stem convolution zero-padded to an even channel count, in the graph.

The transform is dtype-independent: its structure and numerics are checked in float32 on any
machine; the converted-block option (``mxmp.convert(pad_stem=...)``) in emulated bfloat16 on
any machine and with the real bfloat16 kernels where they exist.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxmp
from mxmp._src.graph.stem import STEM_MARK, pad_stem, padded_convolutions, stem_convolutions

SHAPE = (4, 3, 10, 10)


def _net(seed=0, channels=3):
    """Stem (3x3, no bias) + BatchNorm + ReLU, a convolution, pooling, Dense; shapes known."""
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential(prefix='net_')
    with net.name_scope():
        net.add(gluon.nn.Conv2D(8, 3, strides=2, padding=1, use_bias=False),
                gluon.nn.BatchNorm(), gluon.nn.Activation('relu'),
                gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier(magnitude=2))
    net(mx.nd.zeros((1, channels) + SHAPE[2:]))
    return net


def _nodes(sym):
    return json.loads(sym.tojson(remove_amp_cast=False))['nodes']


def _run(sym, net, x):
    """Output and parameter gradients of ``sym`` run (training mode) with ``net``'s parameters."""
    block = gluon.SymbolBlock(sym, mx.sym.var('data'), params=net.collect_params())
    net.collect_params().zero_grad()
    with autograd.record():
        out = block(x)
    out.backward(mx.nd.ones_like(out))
    return out.asnumpy(), {n: p.grad().asnumpy().copy() for n, p in
                           net.collect_params().items() if p.grad_req != 'null'}


def test_padded_graph_structure():
    net = _net()
    sym = net(mx.sym.var('data'))
    assert stem_convolutions(sym, {'data': SHAPE}) == [('net_conv0_fwd', 'data', 3)]
    padded = pad_stem(sym, {'data': SHAPE})
    before, after = _nodes(sym), _nodes(padded)
    added = [n for n in after if n['op'] != 'null' and STEM_MARK in n.get('attrs', {})]
    assert [(n['op'], n['name']) for n in added] == [
        ('slice_axis', 'net_conv0_fwd_stem_data_slice'),
        ('zeros_like', 'net_conv0_fwd_stem_data_zeros'),
        ('Concat', 'net_conv0_fwd_stem_data'),
        ('slice_axis', 'net_conv0_fwd_stem_weight_slice'),
        ('zeros_like', 'net_conv0_fwd_stem_weight_zeros'),
        ('Concat', 'net_conv0_fwd_stem_weight')]
    assert all(n['attrs'][STEM_MARK] == 'net_conv0_fwd' for n in added)
    assert [n['attrs'] for n in added if n['op'] == 'slice_axis'] == \
        [{'axis': '1', 'begin': '0', 'end': '1', STEM_MARK: 'net_conv0_fwd'}] * 2
    assert [n['attrs']['dim'] for n in added if n['op'] == 'Concat'] == ['1', '1']
    assert len(after) == len(before) + 6
    kept = [n for n in after if n not in added]
    assert [n['name'] for n in kept] == [n['name'] for n in before]
    conv = next(n for n in after if n['name'] == 'net_conv0_fwd')
    assert [after[i]['name'] for i, _, _ in conv['inputs']] == \
        ['net_conv0_fwd_stem_data', 'net_conv0_fwd_stem_weight']
    assert padded.list_arguments() == sym.list_arguments()
    assert padded.list_auxiliary_states() == sym.list_auxiliary_states()
    # the weight variable gets its full shape (Gluon traced it as (8, 0, 3, 3)), marked as
    # mxmp's so that remove_casts takes it out again; nothing else changes
    changed = [(n['name'], {k: v for k, v in n.get('attrs', {}).items()
                            if b.get('attrs', {}).get(k) != v})
               for n, b in zip(kept, before) if n.get('attrs') != b.get('attrs')]
    assert changed == [('net_conv0_weight', {'__shape__': '(8, 3, 3, 3)',
                                              STEM_MARK: 'shape:(8, 0, 3, 3)'})]
    # so the padded graph binds with the data shape alone, as mx.mod.Module binds it
    weight = dict(zip(sym.list_arguments(), sym.infer_shape(data=SHAPE)[0]))
    args, outs, _ = padded.infer_shape(data=SHAPE)
    assert dict(zip(padded.list_arguments(), args)) == weight  # (8, 3, 3, 3) stays
    assert outs == [(SHAPE[0], 5)]


def test_only_odd_nchw_input_stems_are_padded():
    net = _net()
    sym = net(mx.sym.var('data'))
    assert pad_stem(sym, {'data': (4, 4, 10, 10)}) is sym  # even: nothing to gain
    assert pad_stem(sym, {}) is sym                        # shape unknown
    data = mx.sym.var('data')
    nhwc = mx.sym.Convolution(data, kernel=(3, 3), num_filter=8, layout='NHWC', name='c')
    assert stem_convolutions(nhwc, {'data': (4, 10, 10, 3)}) == []
    grouped = mx.sym.Convolution(data, kernel=(3, 3), num_filter=3, num_group=3, name='g')
    assert stem_convolutions(grouped, {'data': SHAPE}) == []
    inner = mx.sym.Convolution(mx.sym.relu(data), kernel=(3, 3), num_filter=8, name='i')
    assert stem_convolutions(inner, {'data': SHAPE}) == []
    computed = mx.sym.Convolution(data, mx.sym.var('w') * 2, kernel=(3, 3), num_filter=8,
                                  no_bias=True, name='w2')  # a weight that is no variable
    assert stem_convolutions(computed, {'data': SHAPE}) == [('w2', 'data', 3)]
    assert pad_stem(computed, {'data': SHAPE}) is computed
    with pytest.raises(TypeError, match='Symbol'):
        pad_stem(net, {'data': SHAPE})


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_padded_graph_computes_the_same_outputs_and_gradients_in_float32(seed):
    net = _net(seed)
    sym = net(mx.sym.var('data'))
    x = mx.nd.array(np.random.RandomState(seed).uniform(-1, 1, SHAPE))
    out, grads = _run(sym, net, x)
    padded_out, padded_grads = _run(pad_stem(sym, {'data': SHAPE}), net, x)
    np.testing.assert_allclose(padded_out, out, rtol=1e-5, atol=1e-6)
    assert padded_grads.keys() == grads.keys()
    for name in grads:
        np.testing.assert_allclose(padded_grads[name], grads[name], rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    assert padded_grads['net_conv0_weight'].shape == (8, 3, 3, 3)


def _converted(pad, **kwargs):
    net = _net()
    return net, mxmp.convert(net, 'bfloat16', pad_stem=pad, **kwargs)


def _stems_of(block):
    try:
        return padded_convolutions(mxmp.converted_graph(block))
    except RuntimeError:   # no graph built yet
        return []


def _train_call(block, x):
    with autograd.record():
        out = block(x)
    out.backward()
    grad = block.collect_params()['net_conv0_weight'].grad()  # bfloat16 with cast_params
    return out.asnumpy(), mx.nd.amp_cast(grad, dtype='float32').asnumpy()


def test_converted_block_pads_at_first_call_and_keeps_parameters():
    net, block = _converted(True, emulate=True)
    shapes = {n: p.shape for n, p in net.collect_params().items()}
    assert _stems_of(block) == []  # the channel count is known only at the first call
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, SHAPE))
    block.hybridize()
    out, grad = _train_call(block, x)
    assert _stems_of(block) == ['net_conv0_fwd']
    assert {n: p.shape for n, p in block.collect_params().items()} == shapes
    _, plain = _converted(False, emulate=True)
    plain.hybridize()
    ref_out, ref_grad = _train_call(plain, x)
    assert _stems_of(plain) == []
    # Measured (seeds 0-2, avx512 float32 kernels): outputs identical, stem weight gradients
    # within 1.8e-7 of |g| <= 0.97 (float32 sums in another order). Elsewhere a sum in another
    # order may flip one bfloat16 rounding of an output: 2**-8 relative.
    np.testing.assert_allclose(out, ref_out, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-5)


def test_auto_pads_only_bfloat16_with_real_kernels():
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, SHAPE))
    for kwargs in ({'emulate': True}, {'target_dtype': 'float16', 'emulate': True}):
        net = _net()
        block = mxmp.convert(net, **dict({'target_dtype': 'bfloat16'}, **kwargs))
        block(x)
        assert _stems_of(block) == [], kwargs
    with pytest.raises(ValueError, match='pad_stem'):
        mxmp.convert(_net(), 'bfloat16', pad_stem='yes')


@pytest.mark.real_kernels
@pytest.mark.parametrize('cast_params', [False, True])
def test_auto_pads_with_real_bfloat16_kernels_within_bfloat16_tolerance(cast_params):
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, SHAPE))
    _, block = _converted('auto', cast_params=cast_params)
    block.hybridize()
    out, grad = _train_call(block, x)
    assert _stems_of(block) == ['net_conv0_fwd']
    _, plain = _converted(False, cast_params=cast_params)
    plain.hybridize()
    ref_out, ref_grad = _train_call(plain, x)
    # Measured (seeds 0-2) [avx512_bf16]: identical outputs and stem gradients; the bound
    # allows one bfloat16 rounding flip (2**-8 relative) on other oneDNN kernels.
    np.testing.assert_allclose(out, ref_out, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-2, atol=1e-2)
    # inference: fused by default here, from the padded graph also when the fused graph is
    # its own (cast_params=False: target-dtype weight copies, mxmp._src.gluon_graph)
    np.testing.assert_allclose(block(x).asnumpy(), plain(x).asnumpy(), rtol=1e-2, atol=1e-2)
    assert mxmp._src.gluon.fused_graph(block) is not None
    assert padded_convolutions(mxmp._src.gluon.fused_graph(block)) == ['net_conv0_fwd']
    assert padded_convolutions(mxmp._src.gluon.fused_graph(plain)) == []


_LOAD_PLAIN = r'''
import sys, numpy as np, mxnet as mx
block = mx.gluon.SymbolBlock.imports(sys.argv[1] + '-symbol.json', ['data'],
                                     sys.argv[1] + '-0000.params')
x = mx.nd.array(np.load(sys.argv[2]))
sym, args, aux = mx.model.load_checkpoint(sys.argv[1], 0)
mod = mx.mod.Module(sym, label_names=None)
mod.bind(data_shapes=[('data', x.shape)], for_training=False)
mod.set_params(args, aux)
mod.forward(mx.io.DataBatch([x]), is_train=False)
np.save(sys.argv[3], np.stack([block(x).asnumpy(), mod.get_outputs()[0].asnumpy()]))
'''


def test_exported_padded_block_loads_in_plain_mxnet(tmp_path):
    x = np.random.RandomState(0).uniform(-1, 1, SHAPE).astype('float32')
    net = _net()
    ref = net(mx.nd.array(x)).asnumpy()   # the float32 network, before conversion
    block = mxmp.convert(net, 'bfloat16', pad_stem=True, emulate=True)
    block(mx.nd.array(x))
    assert _stems_of(block) == ['net_conv0_fwd']
    block.export(str(tmp_path / 'm'))
    saved = mx.nd.load(str(tmp_path / 'm-0000.params'))
    assert saved['arg:net_conv0_weight'].shape == (8, 3, 3, 3)
    np.save(str(tmp_path / 'x.npy'), x)
    # plain MXNet, without mxmp on the path
    subprocess.run([sys.executable, '-c', _LOAD_PLAIN, str(tmp_path / 'm'),
                    str(tmp_path / 'x.npy'), str(tmp_path / 'y.npy')], check=True,
                   cwd=str(tmp_path),
                   env={k: v for k, v in os.environ.items() if k != 'PYTHONPATH'})
    imported, bound = np.load(str(tmp_path / 'y.npy'))  # SymbolBlock.imports, Module
    np.testing.assert_allclose(imported, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bound, ref, rtol=1e-5, atol=1e-5)


def test_remove_casts_gives_back_the_unpadded_float32_graph_exactly():
    net = _net()
    sym = net(mx.sym.var('data'))
    assert mxmp.remove_casts(pad_stem(sym, {'data': SHAPE})).tojson() == sym.tojson()
    for cast_params in (False, True):
        converted = mxmp.convert_symbol(sym, 'bfloat16', cast_params=cast_params)
        padded = pad_stem(converted, {'data': SHAPE})
        assert padded_convolutions(padded) == ['net_conv0_fwd']
        assert mxmp.remove_casts(padded).tojson() == sym.tojson()
        # converting a padded graph again plans the unpadded one (the block pads at its call)
        again = mxmp.convert_symbol(padded, 'bfloat16', cast_params=cast_params)
        assert padded_convolutions(again) == [] and again.tojson() == converted.tojson()



def _module(sym, pad, emulate=True):
    label = mx.sym.var('softmax_label')
    mod = mxmp.Module(mx.sym.SoftmaxOutput(sym, label, name='softmax'), target_dtype='bfloat16',
                      emulate=emulate, pad_stem=pad)
    mod.bind(data_shapes=[('data', SHAPE)], label_shapes=[('softmax_label', (SHAPE[0],))])
    return mod


@pytest.mark.parametrize('pad', [True, 'auto', False])
def test_module_pads_at_bind_as_convert_does(pad):
    net = _net()
    sym = net(mx.sym.var('data'))
    args = {k: v.data() for k, v in net.collect_params().items()
            if not k.endswith(('running_mean', 'running_var'))}
    aux = {k: v.data() for k, v in net.collect_params().items()
           if k.endswith(('running_mean', 'running_var'))}
    emulate = not mxmp.lp_kernels_available('bfloat16')
    outs = {}
    for option in (pad, False):
        mod = _module(sym, option, emulate)
        mod.set_params(args, aux)
        x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, SHAPE))
        mod.forward(mx.io.DataBatch([x], [mx.nd.zeros((SHAPE[0],))]), is_train=False)
        outs[option] = mod.get_outputs()[0].asnumpy()
        wanted = option is True or (option == 'auto' and not emulate)
        assert padded_convolutions(mod.mxmp_symbol) == (['net_conv0_fwd'] if wanted else [])
        assert padded_convolutions(mxmp.remove_casts(mod.mxmp_symbol)) == []
    # the same function: float32 kernels (emulation) agree to float32 rounding; real bfloat16
    # kernels run another stem kernel, bfloat16 rounding apart (probabilities, |p| <= 1)
    np.testing.assert_allclose(outs[pad], outs[False], rtol=0,
                               atol=1e-6 if emulate else 2 ** -7)
    with pytest.raises(ValueError, match='pad_stem'):
        mxmp.Module(sym, pad_stem='yes')


def test_remove_casts_is_exact_when_one_weight_feeds_two_stems():
    a, b, w = mx.sym.var('a'), mx.sym.var('b'), mx.sym.var('w')
    g = mx.sym.Group([mx.sym.Convolution(a, w, kernel=(3, 3), num_filter=8, no_bias=True,
                                         name='ca'),
                      mx.sym.Convolution(b, w, kernel=(3, 3), num_filter=8, no_bias=True,
                                         name='cb')])
    padded = pad_stem(g, {'a': SHAPE, 'b': SHAPE})
    assert padded_convolutions(padded) == ['ca', 'cb']
    assert mxmp.remove_casts(padded).tojson() == g.tojson()
