"""Every graph mxmp writes binds and runs in plain MXNet, without mxmp and without being told the
parameters' dtypes: ``mx.mod.Module``, ``mx.model.load_checkpoint`` + ``simple_bind`` and
``gluon.SymbolBlock.imports``. Covers mxmp.convert_symbol, mxmp.amp.convert_symbol /
convert_model / convert_hybrid_block, ``mxmp convert`` and ``export`` of a converted network.

Behind an ``amp_cast`` MXNet cannot infer a weight's dtype; before the writers pinned it
(``__dtype__``), Module.bind failed with "InferType pass cannot decide dtypes ... fc_weight: -1".
"""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon import nn

import mxmp
from mxmp import amp
from mxmp.cli import main

SHAPE = (4, 3, 8, 8)
REAL = mxmp.lp_kernels_available('bfloat16')


def small_net(seed=0):
    """conv-BN-relu-pool-dense, float32, run once (parameters initialized)."""
    mx.random.seed(seed)
    net = nn.HybridSequential(prefix='net_')
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation('relu'),
                nn.GlobalAvgPool2D(), nn.Dense(5))
    net.initialize(mx.init.Xavier())
    net(data(seed))
    return net


def data(seed=0):
    return mx.nd.array(np.random.RandomState(seed).uniform(-1, 1, size=SHAPE))


def float32_model(tmp_path, seed=0):
    """(symbol, arg_params, aux_params, float32 output) of a Symbolic conv-BN-relu-pool-FC.

    Built with mx.sym, as Module users do: its variables carry no ``__dtype__`` (Gluon's do),
    which is what made the converted graphs unbindable. Saved as tmp_path/fp32-*.
    """
    x = mx.sym.var('data')
    x = mx.sym.Convolution(x, num_filter=8, kernel=(3, 3), pad=(1, 1), name='conv')
    x = mx.sym.BatchNorm(x, fix_gamma=False, name='bn')
    x = mx.sym.Activation(x, act_type='relu', name='relu')
    x = mx.sym.Pooling(x, global_pool=True, kernel=(1, 1), pool_type='avg', name='pool')
    sym = mx.sym.FullyConnected(x, num_hidden=5, name='fc')
    mx.random.seed(seed)
    mod = mx.mod.Module(sym, label_names=None, context=mx.cpu())
    mod.bind(data_shapes=[('data', SHAPE)], for_training=False)
    mod.init_params(mx.init.Xavier())
    args, aux = mod.get_params()
    aux = {k: v + 0.1 for k, v in aux.items()}            # non-trivial running statistics
    mod.set_params(args, aux)
    mod.forward(mx.io.DataBatch([data(seed)]), is_train=False)
    mx.model.save_checkpoint(str(tmp_path / 'fp32'), 0, sym, args, aux)
    return sym, args, aux, mod.get_outputs()[0].asnumpy()


def close_to_float32(got, ref):
    # bfloat16 keeps 8 significant bits: each rounding errs by up to 2**-9 relative; the conv,
    # its BN-folded weights and the dense layer add a few. Measured (convert_symbol + Module,
    # cast_params False/True, seeds 0-4): largest error 0.79% of max|ref| with real kernels
    # under oneDNN fusion, 0.61% with MXNET_SUBGRAPH_BACKEND=NONE and emulated; bound 5%.
    assert got.dtype == np.float32
    err = np.abs(got - ref).max()
    assert err <= 0.05 * np.abs(ref).max(), err


def run_module(sym, args, aux, names=('data',), inputs=None):
    """mx.mod.Module: bind with the data shapes only, set the params, forward."""
    inputs = inputs or [data()]
    mod = mx.mod.Module(sym, data_names=list(names), label_names=None, context=mx.cpu())
    mod.bind(data_shapes=[(n, x.shape) for n, x in zip(names, inputs)], for_training=False)
    mod.set_params(args, aux)
    mod.forward(mx.io.DataBatch(inputs), is_train=False)
    return mod.get_outputs()[0].asnumpy()


def run_checkpoint(prefix, names=('data',), inputs=None):
    """mx.model.load_checkpoint + simple_bind with the data shapes only."""
    inputs = inputs or [data()]
    sym, args, aux = mx.model.load_checkpoint(prefix, 0)
    exe = sym.simple_bind(mx.cpu(), grad_req='null',
                          **{n: x.shape for n, x in zip(names, inputs)})
    for name, value in list(args.items()) + list(aux.items()):
        target = exe.arg_dict.get(name, exe.aux_dict.get(name))
        assert np.dtype(target.dtype) == np.dtype(value.dtype), name  # __dtype__ was honoured
        value.copyto(target)
    for n, x in zip(names, inputs):
        x.copyto(exe.arg_dict[n])
    return exe.forward(is_train=False)[0].asnumpy()


def run_imports(prefix, names=('data',), inputs=None):
    """gluon.SymbolBlock.imports."""
    inputs = inputs or [data()]
    block = gluon.SymbolBlock.imports(prefix + '-symbol.json', list(names),
                                      prefix + '-0000.params')
    return block(*inputs).asnumpy()


def save(prefix, sym, args, aux):
    mx.model.save_checkpoint(prefix, 0, sym, args, aux, remove_amp_cast=False)


def has_casts(sym):
    return mxmp.count_casts(sym)['amp_cast'] > 0


@pytest.mark.parametrize('cast_params', [False, True])
def test_convert_symbol_output_binds_in_module_checkpoint_and_symbolblock(tmp_path, cast_params):
    sym, args, aux, ref = float32_model(tmp_path)
    out = mxmp.convert_symbol(sym, 'bfloat16', cast_params=cast_params, emulate=not REAL)
    assert has_casts(out)
    # what a user of plain MXNet does with the parameters: cast them as the graph says
    _, args, aux = amp.convert_model(sym, args, aux, 'bfloat16',
                                     cast_optional_params=cast_params)
    if cast_params:
        assert mxmp._src.dtypes.dtype_name(args['conv_weight'].dtype) == 'bfloat16'
    close_to_float32(run_module(out, args, aux), ref)
    save(str(tmp_path / 'mp'), out, args, aux)
    close_to_float32(run_checkpoint(str(tmp_path / 'mp')), ref)
    close_to_float32(run_imports(str(tmp_path / 'mp')), ref)


def test_every_parameter_dtype_is_pinned_and_strip_restores_the_graph(tmp_path):
    sym, _, _, _ = float32_model(tmp_path)
    out = mxmp.convert_symbol(sym, 'bfloat16')
    attrs = out.attr_dict()
    for name in out.list_arguments() + out.list_auxiliary_states():
        if name == 'data':
            assert '__dtype__' not in attrs.get(name, {})      # data inputs stay free
        else:
            assert attrs[name]['__dtype__'] == '0', name      # float32 (mshadow enum 0)
    assert mxmp.remove_casts(out).tojson() == sym.tojson()
    again = mxmp.convert_symbol(out, 'bfloat16')
    assert again.tojson(remove_amp_cast=False) == out.tojson(remove_amp_cast=False)


def test_module_bind_was_the_reported_failure(tmp_path):
    """The exact report: amp.convert_model's symbol in mx.mod.Module, bound with data only."""
    sym, args, aux, ref = float32_model(tmp_path)
    out, new_args, new_aux = amp.convert_model(sym, args, aux, target_dtype='bfloat16')
    mod = mx.mod.Module(out, data_names=['data'], label_names=None)
    mod.bind(data_shapes=[('data', SHAPE)], for_training=False)   # raised InferType before
    arg_types = dict(zip(out.list_arguments(), out.infer_type(data='float32')[0]))
    assert arg_types['fc_weight'] == np.float32
    if REAL:
        mod.set_params(new_args, new_aux)
        mod.forward(mx.io.DataBatch([data()]), is_train=False)
        close_to_float32(mod.get_outputs()[0].asnumpy(), ref)


@pytest.mark.parametrize('cast_params', [False, True])
def test_converted_block_export_loads_in_plain_mxnet(tmp_path, cast_params):
    net = small_net()
    ref = net(data()).asnumpy()
    block = amp.convert_hybrid_block(net, target_dtype='bfloat16',
                                     cast_optional_params=cast_params)
    block.hybridize()
    close_to_float32(block(data()).asnumpy(), ref)
    block.export(str(tmp_path / 'blk'), remove_amp_cast=False)
    exported = mx.sym.load(str(tmp_path / 'blk-symbol.json'))
    assert mxmp.count_casts(exported)['amp_cast'] > 0 or not REAL
    close_to_float32(run_imports(str(tmp_path / 'blk')), ref)
    close_to_float32(run_checkpoint(str(tmp_path / 'blk')), ref)
    _, args, aux = mx.model.load_checkpoint(str(tmp_path / 'blk'), 0)
    close_to_float32(run_module(exported, args, aux), ref)


@pytest.mark.parametrize('cast_params', [False, True])
def test_cli_convert_output_loads_in_plain_mxnet(tmp_path, capsys, cast_params):
    sym, args, aux, ref = float32_model(tmp_path)
    argv = ['convert', str(tmp_path / 'fp32-symbol.json'), str(tmp_path / 'fp32-0000.params'),
            '--dtype', 'bfloat16', '--out', str(tmp_path / 'cli')]
    argv += ['--cast-params'] if cast_params else []
    argv += [] if REAL else ['--emulate']
    assert main(argv) == 0
    capsys.readouterr()
    prefix = str(tmp_path / 'cli')
    close_to_float32(run_checkpoint(prefix), ref)
    close_to_float32(run_imports(prefix), ref)
    out, args, aux = mx.model.load_checkpoint(prefix, 0)
    close_to_float32(run_module(out, args, aux), ref)


def test_graph_with_unknown_shapes_binds_after_conversion(tmp_path):
    """A three-input text encoder with arange_like (positions): the CLI converts it, and the
    result binds in mx.mod.Module with the three data shapes."""
    net = _encoder()
    inputs = _encoder_inputs()
    ref = net(*inputs).asnumpy()
    net.export(str(tmp_path / 'enc'))
    names = ('data0', 'data1', 'data2')
    argv = ['convert', str(tmp_path / 'enc-symbol.json'), str(tmp_path / 'enc-0000.params'),
            '--dtype', 'bfloat16', '--out', str(tmp_path / 'enc_mp')]
    for n in names:
        argv += ['--data-name', n]
    assert main(argv + ([] if REAL else ['--emulate'])) == 0
    out, args, aux = mx.model.load_checkpoint(str(tmp_path / 'enc_mp'), 0)
    assert has_casts(out) or not REAL
    close_to_float32(run_module(out, args, aux, names, inputs), ref)


class _Encoder(gluon.HybridBlock):
    """Token + segment + position embeddings (positions from arange_like, as gluonnlp's BERT),
    a dense layer, and a valid-length mask: three inputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.word = nn.Embedding(20, 8)
            self.segment = nn.Embedding(2, 8)
            self.position = nn.Embedding(16, 8)
            self.proj = nn.Dense(8, flatten=False)

    def hybrid_forward(self, F, tokens, segments, valid_length):  # noqa: N803 (Gluon's F)
        x = self.word(tokens) + self.segment(segments)
        steps = F.contrib.arange_like(x, axis=1)
        x = F.broadcast_add(x, F.expand_dims(self.position(steps), axis=0))
        x = self.proj(x)
        mask = F.broadcast_lesser(F.reshape(steps, shape=(1, -1)),
                                  F.reshape(valid_length, shape=(-1, 1)))
        return F.broadcast_mul(x, F.expand_dims(mask, axis=2))


def _encoder():
    mx.random.seed(0)
    net = _Encoder(prefix='enc_')
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(*_encoder_inputs())
    return net


def _encoder_inputs():
    rng = np.random.RandomState(0)
    return [mx.nd.array(rng.randint(0, 20, (2, 5))), mx.nd.array(rng.randint(0, 2, (2, 5))),
            mx.nd.array([3, 5])]


def test_cli_converts_a_graph_whose_shapes_it_cannot_check(tmp_path, capsys):
    """`mxmp convert` warns, never rejects, when MXNet cannot infer shapes from the params
    alone: arange_like raised "cannot handle param.axis" and the CLI used to stop there."""
    net = _encoder()
    net.export(str(tmp_path / 'enc'))
    sym = mx.sym.load(str(tmp_path / 'enc-symbol.json'))
    args = {k[4:]: v for k, v in mx.nd.load(str(tmp_path / 'enc-0000.params')).items()}
    with pytest.raises(mx.base.MXNetError, match='arange_like'):
        sym.infer_shape_partial(**{k: v.shape for k, v in args.items()})
    code = main(['convert', str(tmp_path / 'enc-symbol.json'), str(tmp_path / 'enc-0000.params'),
                 '--dtype', 'bfloat16', '--data-name', 'data0', '--data-name', 'data1',
                 '--data-name', 'data2', '--out', str(tmp_path / 'enc_mp')])
    _, err = capsys.readouterr()
    assert code == 0
    assert 'warning' in err and 'arange_like' in err
    written = json.load(open(str(tmp_path / 'enc_mp-symbol.json')))
    assert any(n['op'] == 'amp_cast' for n in written['nodes'])
