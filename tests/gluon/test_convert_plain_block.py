"""mxmp.convert on a plain gluon.Block (Python forward) converts its outermost HybridBlocks:
GluonNLP 0.10's NMTModel, the model of its machine-translation training script, trains in
bfloat16 with ``mxmp.convert(model)`` (its encoder, decoder, embedding and output layer)."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxmp


def _graph_ops(block):
    nodes = json.loads(block._cached_graph[1].tojson(remove_amp_cast=False))['nodes']
    return [n for n in nodes if n['op'] != 'null']


class Outer(gluon.Block):
    """Python forward around two HybridBlocks, one of them inside a plain Block."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.first = gluon.nn.Dense(16, in_units=8)
            self.inner = gluon.nn.Sequential()   # a plain Block holding a HybridBlock
            self.inner.add(gluon.nn.Dense(4, in_units=16))

    def forward(self, x):   # pylint: disable=arguments-differ
        h = self.first(x)
        return self.inner(mx.nd.relu(h) * 0.5)


def test_plain_block_converts_its_hybrid_parts():
    mx.random.seed(0)
    net = Outer()
    net.initialize(mx.init.Xavier())
    x = mx.nd.array(np.random.RandomState(0).normal(size=(4, 8)))
    ref = net(x).asnumpy()
    assert mxmp.convert(net, 'bfloat16') is net
    x.attach_grad()
    with autograd.record():
        out = net(x)
    out.backward()
    assert out.dtype == np.float32 and x.grad.dtype == np.float32
    assert np.abs(out.asnumpy() - ref).max() <= 0.02 * np.abs(ref).max()
    for dense in (net.first, net.inner[0]):   # real kernels or emulated: the pass ran
        assert [n for n in _graph_ops(dense) if n['op'] == 'amp_cast']
        rows = mxmp.explain(dense._cached_graph[1])
        assert [r.dtype for r in rows if r.op == 'FullyConnected'] == ['bfloat16']
    with pytest.raises(ValueError, match='already converted'):
        mxmp.convert(net, 'float16')


def test_gluonnlp_nmt_model_trains_converted():
    nlp = pytest.importorskip('gluonnlp')
    mx.random.seed(0)
    enc, dec, step = nlp.model.transformer.get_transformer_encoder_decoder(
        num_layers=1, num_heads=2, units=16, hidden_size=32, dropout=0.0, max_src_length=20,
        max_tgt_length=20)
    model = nlp.model.translation.NMTModel(
        src_vocab=range(50), tgt_vocab=range(50), encoder=enc, decoder=dec,
        one_step_ahead_decoder=step, share_embed=True, embed_size=16, tie_weights=True,
        embed_initializer=None, prefix='nmt_')
    model.initialize(mx.init.Xavier(magnitude=3.0))
    mxmp.convert(model, 'bfloat16')
    model.hybridize(static_alloc=True)
    trainer = mxmp.Trainer(model.collect_params(), 'adam', {'learning_rate': 1e-3})
    loss_fn = nlp.loss.MaskedSoftmaxCELoss()
    rng = np.random.RandomState(0)
    src = mx.nd.array(rng.randint(1, 50, size=(4, 9)))
    tgt = mx.nd.array(rng.randint(1, 50, size=(4, 7)))
    length = mx.nd.array([9, 5, 7, 3])
    tgt_length = mx.nd.array([7, 4, 6, 2])
    losses = []
    for _ in range(3):
        with autograd.record():
            out, _ = model(src, tgt, length, tgt_length)
            loss = loss_fn(out, tgt, tgt_length).mean()
        loss.backward()
        trainer.step(1)
        losses.append(float(loss.asscalar()))
    assert out.dtype == np.float32 and out.shape == (4, 7, 50)
    assert losses[2] < losses[0]   # Adam at 1e-3 on one batch: the loss falls
    fcs = [n for n in _graph_ops(model.decoder) if n['op'] == 'FullyConnected']
    assert fcs
    rows = {r.name: r.dtype for r in mxmp.explain(model.decoder._cached_graph[1])}
    assert {rows[n['name']] for n in fcs} == {'bfloat16'}
