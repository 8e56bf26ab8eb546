"""The gradient-order rule (mxmp/_src/graph/grad_order.py): the CachedOp of a converted Gluon
block walks its parameters latest-used first, so MXNet schedules each weight cast's backward
right after its layer's backward (in MXNet's default order every one waits for the first
layer's), with the same values and gradients bit for bit; a graph whose parameters feed their
layers directly is left alone; every other step of mxmp (``remove_casts``, a second conversion,
``export``) sees no control dependency, and a block with a subgraph backend (whose partitioner
refuses control dependencies) is built on the plain graph; a seed gives a converted network the
float32 network's initial weights."""
import json
import re

import mxnet as mx
import numpy as np
import pytest

import mxmp
from mxmp._src.graph.grad_order import substitute
from mxmp._src.graph.symbol_json import dump, load

LAYERS, UNITS, BATCH = 5, 16, 4


def _mlp():
    h = mx.sym.var('data')
    for i in range(LAYERS):
        h = mx.sym.relu(mx.sym.FullyConnected(h, num_hidden=UNITS, name='fc%d' % i))
    return mx.sym.FullyConnected(h, num_hidden=3, name='head')


def _params():
    return [n for i in list(range(LAYERS)) + ['head']
            for n in ('%s_weight' % ('fc%d' % i if i != 'head' else i),
                      '%s_bias' % ('fc%d' % i if i != 'head' else i))]


def _convert(sym, **kw):
    """The converted graph in the rule's walk order, and without it."""
    plain = mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', **kw))
    return dump(substitute(load(plain), {'data'})), plain


def _control_deps(sym):
    return [n for n in json.loads(sym.tojson(remove_amp_cast=False))['nodes']
            if n.get('control_deps')]


def test_parameters_walk_latest_used_first():
    sym = _mlp()
    assert sym.list_arguments() == ['data'] + _params()   # MXNet's walk: first layer first
    converted, plain = _convert(sym)
    assert plain.list_arguments() == ['data'] + _params()
    layers = ['head'] + ['fc%d' % i for i in reversed(range(LAYERS))]
    assert converted.list_arguments() == [n % l for l in layers
                                          for n in ('%s_weight', '%s_bias')] + ['data']
    deps = _control_deps(converted)
    assert [n['name'] for n in deps] == ['data']   # on the first variable, nowhere else


def _schedule(sym):
    reqs = {n: 'null' if n == 'data' else 'write' for n in sym.list_arguments()}
    shapes = {'data': (BATCH, 8)}
    exe = sym.simple_bind(mx.cpu(), grad_req=reqs, **shapes)
    return [m.group(1) for m in re.finditer(r'^Op:[^,]+, Name=(.*)$', exe.debug_str(), re.M)]


def _cast_of(graph, param):
    """The name of the cast node that reads ``param`` in the graph JSON."""
    nodes = graph['nodes']
    ids = {n['name']: i for i, n in enumerate(nodes)}
    return next(n['name'] for n in nodes if n['op'] == 'amp_cast' and
                n['inputs'][0][0] == ids[param])


def test_each_weight_cast_backward_follows_its_layers_backward():
    converted, plain = _convert(_mlp(), emulate=False)
    graph = load(plain)
    for sym, interleaved in ((converted, True), (plain, False)):
        order = _schedule(sym)
        for i in range(1, LAYERS):
            cast_back = order.index(_cast_of(graph, 'fc%d_weight' % i) + '_backward')
            # before the backward of the layer below (MXNet's order: after the first layer's)
            assert (cast_back < order.index('fc%d_backward' % (i - 1))) == interleaved, i


@pytest.mark.parametrize('seed', [0, 1])
def test_values_and_gradients_are_unchanged_bit_for_bit(seed):
    emulate = not mxmp.lp_kernels_available('bfloat16')
    converted, plain = _convert(_mlp(), emulate=emulate)
    assert _control_deps(converted) and not _control_deps(plain)
    rng = np.random.RandomState(seed)
    shapes = dict(zip(converted.list_arguments(),
                      converted.infer_shape(data=(BATCH, 8))[0]))
    values = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    values['data'][0, 0] = np.float32(1e30)    # large, and below bfloat16's smallest normal
    values['data'][1, 1] = np.float32(1e-40)
    head = rng.normal(size=(BATCH, 3)).astype(np.float32)
    results = []
    for sym in (converted, plain):
        args = {n: mx.nd.array(v) for n, v in values.items()}
        grads = {n: mx.nd.zeros(v.shape) for n, v in values.items() if n != 'data'}
        exe = sym.bind(mx.cpu(), args, args_grad=grads,
                       grad_req={n: 'write' if n in grads else 'null' for n in args})
        out = exe.forward(is_train=True)[0].asnumpy()
        exe.backward(mx.nd.array(head))
        results.append((out, {n: g.asnumpy() for n, g in grads.items()}))
    (out_a, grads_a), (out_b, grads_b) = results
    np.testing.assert_array_equal(out_a, out_b)
    for name in grads_a:
        np.testing.assert_array_equal(grads_a[name], grads_b[name])
    assert all(np.isfinite(g).all() for g in grads_a.values())   # not NaN against NaN


def test_parameters_read_directly_get_no_order():
    # cast_params: the weights are stored in bfloat16 and read by their layers, no cast backward
    converted, _ = _convert(_mlp(), param_dtype='bfloat16')
    assert not _control_deps(converted)
    assert converted.list_arguments() == ['data'] + _params()


def test_other_steps_see_the_plain_graph():
    sym = _mlp()
    converted, plain = _convert(sym)
    assert not any(n.get('control_deps') for n in load(converted)['nodes'])
    assert json.loads(mxmp.remove_casts(converted).tojson(remove_amp_cast=False)) == \
        json.loads(sym.tojson(remove_amp_cast=False))
    again = mxmp.convert_symbol(converted, 'bfloat16')
    assert again.tojson(remove_amp_cast=False) == plain.tojson(remove_amp_cast=False)


def _gluon_mlp():
    net = mx.gluon.nn.HybridSequential()
    for _ in range(LAYERS):
        net.add(mx.gluon.nn.Dense(UNITS, activation='relu'))   # in_units deferred
    net.add(mx.gluon.nn.Dense(3))
    return net


@pytest.mark.parametrize('seed', [0, 3])
def test_a_seed_gives_a_converted_network_the_float32_networks_weights(seed):
    # Gluon initializes deferred Parameters in the graph's input order; the converted graph's
    # order is the rule's, the draws must still follow the float32 graph's
    x = mx.nd.array(np.random.RandomState(seed).normal(size=(BATCH, 8)))
    weights = []
    for convert in (False, True):
        mx.random.seed(seed)
        net = _gluon_mlp()
        net.initialize(mx.init.Xavier())
        if convert:
            net = mxmp.convert(net, 'bfloat16')
        net.hybridize()
        with mx.autograd.record():
            net(x).backward()
        weights.append([p.data().astype('float32').asnumpy()
                        for p in net.collect_params().values()])
    float32, converted = weights
    assert len(float32) == 2 * (LAYERS + 1)
    for a, b in zip(float32, converted):
        np.testing.assert_array_equal(a, b)


def _trained(backend=None, seed=0):
    mx.random.seed(seed)
    net = _gluon_mlp()
    net.initialize(mx.init.Xavier())
    net = mxmp.convert(net, 'bfloat16')
    net.hybridize(backend=backend) if backend else net.hybridize()
    x = mx.nd.array(np.random.RandomState(seed).normal(size=(BATCH, 8)))
    with mx.autograd.record():
        out = net(x)
    out.backward()
    return net, out


def test_the_cached_op_of_a_converted_block_takes_the_last_layer_first(tmp_path):
    net, _ = _trained()
    taken = [p.name for is_arg, p in net._cached_op_args if not is_arg]
    names = [p.name for p in net.collect_params().values()]
    assert taken == [n for k in reversed(range(0, len(names), 2)) for n in names[k:k + 2]]
    # the block's graph (what export, freeze and the fused twin read) is the plain one
    assert not _control_deps(net._cached_graph[1])
    net.export(str(tmp_path / 'mlp'), remove_amp_cast=False)
    saved = json.loads((tmp_path / 'mlp-symbol.json').read_text())
    assert not any(n.get('control_deps') for n in saved['nodes'])


def test_a_block_with_a_subgraph_backend_builds_on_the_plain_graph():
    # MXNet's partitioner refuses any control dependency (build_subgraph.cc); it must not see one
    net, out = _trained(backend='MKLDNN')
    ref, ref_out = _trained()
    np.testing.assert_allclose(out.asnumpy(), ref_out.asnumpy(), rtol=1e-2, atol=1e-2)
    taken = [p.name for is_arg, p in net._cached_op_args if not is_arg]
    assert taken == [p.name for p in net.collect_params().values()]   # MXNet's own order
