"""Gradient accumulation (``grad_req='add'``) through converted graphs
(mxmp/_src/graph/accumulate.py): MXNet 1.9.1's backward of amp_cast/amp_multicast/clip ignores
``req=kAddTo``, so mxmp reads accumulating parameters through an identity."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, nd
from mxnet.contrib.amp.amp import bfloat16
from mxnet.gluon import nn

import mxmp


@pytest.fixture(autouse=True)
def clean():
    yield
    mxmp.remove_hooks()


def twice(f):
    """The gradient of sum(f(w)) after one and after two backward passes, grad_req='add'."""
    w = nd.ones((8, 4))
    w.attach_grad(grad_req='add')
    out = []
    for _ in range(2):
        with autograd.record():
            y = f(w).sum()
        y.backward()
        out.append(float(w.grad.asnumpy().sum()))
    return out


def test_the_mxnet_fact_the_guard_exists_for():
    """If this fails, MXNet accumulates through these ops now: the guard can go."""
    assert twice(lambda w: nd.amp_cast(nd.amp_cast(w, dtype=bfloat16), dtype='float32')) == \
        [0.0, 0.0]
    assert twice(lambda w: nd.clip(w, -10, 10)) == [32.0, 32.0]
    assert twice(lambda w: nd.amp_cast(nd.amp_cast(nd.identity(w), dtype=bfloat16),
                                       dtype='float32')) == [32.0, 64.0]


def dense_net(seed=0):
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(8, in_units=4, flatten=False), nn.Dense(3, in_units=8, flatten=False))
    net.initialize(mx.init.Xavier())
    return net


def grads(net, batches):
    net.collect_params().zero_grad()
    for x in batches:
        with autograd.record():
            y = net(x).sum()
        y.backward()
    return [p.grad().asnumpy().copy() for p in net.collect_params().values()]


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_accumulated_gradients_are_the_sum_of_the_passes(dtype):
    rng = np.random.RandomState(0)
    batches = [nd.array(rng.normal(size=(2, 3, 4))) for _ in range(2)]
    net = mxmp.convert(dense_net(), dtype)
    one = [grads(net, [x]) for x in batches]        # grad_req 'write': one pass each
    for p in net.collect_params().values():
        p.grad_req = 'add'                          # after the graph was built: rebuilt
    both = grads(net, batches)
    for g, a, b in zip(both, *one):
        assert np.abs(g).max() > 0
        np.testing.assert_allclose(g, a + b, rtol=1e-5, atol=1e-6)
    nodes = json.loads(mxmp.converted_graph(net).tojson(remove_amp_cast=False))['nodes']
    assert sum(n['op'] == '_copy' for n in nodes) == 4          # one per parameter
    stripped = json.loads(mxmp.remove_casts(mxmp.converted_graph(net)).tojson())['nodes']
    assert not any(n['op'] == '_copy' for n in stripped)


def test_without_accumulation_the_graph_has_no_identity():
    net = mxmp.convert(dense_net(), 'bfloat16')
    grads(net, [nd.ones((2, 3, 4))])
    nodes = json.loads(mxmp.converted_graph(net).tojson(remove_amp_cast=False))['nodes']
    assert not any(n['op'] == '_copy' for n in nodes)


@pytest.mark.parametrize('grad_req', ['add', {'fc_weight': 'add', 'fc_bias': 'add'}])
def test_module_accumulates_with_grad_req_add(grad_req):
    data = mx.sym.var('data')
    out = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(data, num_hidden=3, name='fc'),
                               name='softmax')
    rng = np.random.RandomState(0)
    it = mx.io.NDArrayIter(rng.normal(size=(4, 5)).astype('float32'),
                           np.array([0, 1, 2, 0], dtype='float32'), batch_size=4,
                           label_name='softmax_label')
    batch = next(iter(it))

    def weight_grad(req, passes):
        mod = mxmp.Module(out, ['data'], ['softmax_label'], target_dtype='bfloat16')
        mod.bind(data_shapes=it.provide_data, label_shapes=it.provide_label, grad_req=req)
        mod.init_params(mx.init.Xavier(rnd_type='gaussian', magnitude=1))
        mod.set_params({'fc_weight': nd.array(rng.normal(size=(3, 5))) * 0 + 0.1,
                        'fc_bias': nd.zeros((3,))}, {})
        for _ in range(passes):
            mod.forward(batch, is_train=True)
            mod.backward()
        group = mod._exec_group
        return group.grad_arrays[group.param_names.index('fc_weight')][0].asnumpy()

    once = weight_grad('write', 1)
    assert np.abs(once).max() > 0
    np.testing.assert_allclose(weight_grad(grad_req, 2), 2 * once, rtol=1e-5, atol=1e-6)
