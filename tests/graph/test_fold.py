"""mxmp._src.graph.fold: BatchNorm folded into the Convolution before it, in float32, for the
fused inference graph. Structure and float32 numerics on any machine; what the fused graph
runs on the real bfloat16 kernels is in tests/gluon/test_fused_inference.py and
tests/gluon/test_fused_accuracy.py.
"""
import json

import mxnet as mx
import numpy as np
import pytest

import mxmp
from mxmp._src.graph.fold import (FOLD_MARK, batchnorm_folds, fold_batchnorm, folded_values,
                                  fold_rule)

SHAPE = (2, 4, 6, 6)


def _nodes(sym):
    return json.loads(sym.tojson(remove_amp_cast=False))['nodes']


def _ops(sym):
    return [n['op'] for n in _nodes(sym) if n['op'] != 'null']


def _block(x, name, bias=False, fix_gamma=False, **bn):
    conv = mx.sym.Convolution(x, num_filter=4, kernel=(3, 3), pad=(1, 1), no_bias=not bias,
                              name=name)
    return mx.sym.BatchNorm(conv, fix_gamma=fix_gamma, eps=1e-5, name=name + '_bn', **bn)


def _residual():
    """conv+BN+relu, conv(with bias)+BN (fix_gamma) + the block input, relu: both BNs fold."""
    x = mx.sym.var('data')
    y = mx.sym.relu(_block(x, 'c1'))
    y = _block(y, 'c2', bias=True, fix_gamma=True) + x
    return mx.sym.relu(y)


def _values(sym, seed=0):
    """Random arguments and BatchNorm statistics far from identity (float32)."""
    rng = np.random.RandomState(seed)
    shapes, _, aux_shapes = sym.infer_shape(data=SHAPE)
    args = {n: mx.nd.array(rng.normal(size=s)) for n, s in zip(sym.list_arguments(), shapes)}
    aux = {n: mx.nd.array(rng.uniform(0.5, 2, size=s) if n.endswith('var') else
                          rng.normal(size=s)) for n, s in zip(sym.list_auxiliary_states(),
                                                               aux_shapes)}
    return args, aux


def _forward(sym, args, aux):
    exe = sym.bind(mx.cpu(), args=args, aux_states=aux, grad_req='null')
    return exe.forward(is_train=False)[0].asnumpy()


def test_folded_graph_has_no_batchnorm_and_computes_the_same_function(monkeypatch):
    monkeypatch.setenv('MXNET_SUBGRAPH_BACKEND', 'NONE')   # MXNet folds nothing itself
    sym = _residual()
    folded, folds = fold_batchnorm(sym)
    assert _ops(folded) == ['Convolution', 'relu', 'Convolution', 'elemwise_add', 'relu']
    assert [(f.conv, f.bn, f.weight, f.bias, f.fix_gamma) for f in folds] == [
        ('c1', 'c1_bn', 'c1_weight', None, False), ('c2', 'c2_bn', 'c2_weight', 'c2_bias', True)]
    by_name = {n['name']: n for n in _nodes(folded)}
    for f in folds:
        assert by_name[f.conv]['attrs']['no_bias'] == 'False'
        assert [_nodes(folded)[i[0]]['name'] for i in by_name[f.conv]['inputs']][1:] == [
            f.new_weight, f.new_bias]
        assert by_name[f.new_weight]['attrs'] == {FOLD_MARK: f.bn}
    args, aux = _values(sym)
    ref = _forward(sym, args, aux)
    every = dict(args, **aux)
    new = {n: a for n, a in args.items() if n in folded.list_arguments()}
    for f in folds:
        new[f.new_weight], new[f.new_bias] = folded_values(f, every.__getitem__)
    got = _forward(folded, new, {})
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_folded_values_are_batchnorm_inference_in_float32():
    sym = _block(mx.sym.var('data'), 'c', bias=True)
    (fold,) = fold_batchnorm(sym)[1]
    args, aux = _values(sym, seed=1)
    every = dict(args, **aux)
    weight, bias = folded_values(fold, every.__getitem__)
    g, b, m, v = (every[n].asnumpy() for n in ('c_bn_gamma', 'c_bn_beta', 'c_bn_moving_mean',
                                                  'c_bn_moving_var'))
    scale = g / np.sqrt(v + 1e-5)
    assert weight.dtype == np.float32 and bias.dtype == np.float32
    np.testing.assert_allclose(weight.asnumpy(),
                               args['c_weight'].asnumpy() * scale[:, None, None, None],
                               rtol=1e-6)
    np.testing.assert_allclose(bias.asnumpy(), b + (args['c_bias'].asnumpy() - m) * scale,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('case', ['conv output used twice', 'channel-last BatchNorm',
                                  'output_mean_var', 'computed weight', 'BatchNorm after relu'])
def test_batchnorms_that_cannot_fold_are_left_alone(case):
    x = mx.sym.var('data')
    weight = mx.sym.var('c_weight')
    if case == 'computed weight':
        weight = weight * 2
    conv = mx.sym.Convolution(x, weight, num_filter=4, kernel=(3, 3), pad=(1, 1), no_bias=True,
                              name='c')
    bn_in = mx.sym.relu(conv) if case == 'BatchNorm after relu' else conv
    kwargs = {'axis': 3} if case == 'channel-last BatchNorm' else {}
    if case == 'output_mean_var':
        kwargs['output_mean_var'] = True
    out = mx.sym.BatchNorm(bn_in, fix_gamma=False, name='bn', **kwargs)
    if case == 'output_mean_var':
        out = out[0]
    if case == 'conv output used twice':
        out = out + conv
    folded, folds = fold_batchnorm(out)
    assert folds == [] and folded is out
    assert batchnorm_folds(out) == {}


def test_explain_names_the_fold_on_low_precision_convolutions_only():
    sym = _residual()
    assert batchnorm_folds(sym) == {'c1_bn': 'c1', 'c2_bn': 'c2'}
    rules = {r.name: r.rule for r in mxmp.explain(sym, 'bfloat16')}
    assert rules['c1_bn'].endswith('; ' + fold_rule('c1'))
    assert 'fold_batchnorm=False' in rules['c2_bn'] and 'c2 in float32' in rules['c2_bn']
    assert 'fold' not in rules['c1'] and 'fold' not in rules['c2']
    # a float32 Convolution: MXNet's own fold is in float32, nothing to name
    policy = mxmp.Policy('bfloat16', fp32_ops=('Convolution',))
    assert not [r for r in mxmp.explain(sym, policy=policy) if 'fold' in r.rule]


def test_a_bad_fold_batchnorm_value_is_refused_with_the_choices():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3))
    with pytest.raises(ValueError, match='fold_batchnorm=.yes.: use True or False'):
        mxmp.convert(net, 'bfloat16', emulate=True, fold_batchnorm='yes')
