#!/usr/bin/env python3
"""Worker of tests/conformance/test_real_kernels.py: one model in real bfloat16 against float32.

    python tests/conformance/real_kernels_worker.py MODEL [--seed S] [--cast-params] [--steps N] [--lr LR]

Runs in its own process, so that a oneDNN kernel that corrupts memory fails this model only.
Two copies of MODEL get the same initial float32 values (seed ``S``). The float32 copy runs
as it is; the other runs one float32 inference forward (the usual migration path: oneDNN then
holds convolution weights in its blocked layout) and is converted with
``mxmp.convert(net, 'bfloat16')`` on the real oneDNN kernels (no emulation). Both are trained
for N steps (default 3) with ``mxmp.Trainer`` (SGD, learning rate 1e-4, momentum 0.9) on the
same batches. Printed as one JSON line: the relative output error ``max|bf16 - f32| /
max|f32|`` of inference outputs before (``rel_err_before``) and after (``rel_err_after``)
training and of each step's training-mode forward (``rel_err_train``), the relative error
``||g_bf16 - g_f32|| / ||g_f32||`` of all parameter gradients of each step (``grad_rel_err``),
the losses of each step and the seconds taken.

Models (``MODELS``): GluonCV resnet18_v1 (64x64, batch 4), mobilenetv2_1.0 (96x96, batch 4),
densenet121 (224x224, batch 2), a transformer block (``TransformerBlock``: LayerNorm,
multi-head attention whose heads are split and merged with reshape/transpose, feed-forward;
batch 8, 32 tokens, 64 units, 4 heads) and an LSTM language model (``LSTMLanguageModel``:
Embedding, one-layer ``gluon.rnn.LSTM``, Dense over the vocabulary; batch 8, 32 tokens).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon, nd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import mxmp  # noqa: E402


class TransformerBlock(gluon.HybridBlock):
    """Pre-norm transformer encoder block on (batch, tokens, units) float32 input."""

    def __init__(self, units=64, heads=4, hidden=128, **kwargs):
        super().__init__(**kwargs)
        self._heads, self._scale = heads, 1.0 / math.sqrt(units // heads)
        with self.name_scope():
            self.ln1 = gluon.nn.LayerNorm(in_channels=units)
            self.qkv = gluon.nn.Dense(3 * units, flatten=False, in_units=units)
            self.proj = gluon.nn.Dense(units, flatten=False, in_units=units)
            self.ln2 = gluon.nn.LayerNorm(in_channels=units)
            self.ffn1 = gluon.nn.Dense(hidden, flatten=False, activation='relu', in_units=units)
            self.ffn2 = gluon.nn.Dense(units, flatten=False, in_units=hidden)

    def _split_heads(self, F, x):
        # (B, T, U) -> (B, T, H, U/H) -> (B, H, T, U/H) -> (B*H, T, U/H)
        x = F.transpose(F.reshape(x, shape=(0, 0, self._heads, -1)), axes=(0, 2, 1, 3))
        return F.reshape(x, shape=(-3, 0, 0))

    def hybrid_forward(self, F, x):
        q, k, v = F.split(self.qkv(self.ln1(x)), num_outputs=3, axis=-1)
        q, k, v = (self._split_heads(F, t) for t in (q, k, v))
        att = F.softmax(F.batch_dot(q, k, transpose_b=True) * self._scale, axis=-1)
        o = F.reshape(F.batch_dot(att, v), shape=(-4, -1, self._heads, 0, 0))   # (B, H, T, D)
        o = F.reshape(F.transpose(o, axes=(0, 2, 1, 3)), shape=(0, 0, -3))       # (B, T, U)
        x = x + self.proj(o)
        return x + self.ffn2(self.ffn1(self.ln2(x)))


class LSTMLanguageModel(gluon.HybridBlock):
    """Embedding -> LSTM -> Dense: next-token logits (batch, tokens, vocab) from token ids."""

    def __init__(self, vocab=200, embed=32, hidden=64, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = gluon.nn.Embedding(vocab, embed)
            self.lstm = gluon.rnn.LSTM(hidden, layout='NTC', input_size=embed)
            self.out = gluon.nn.Dense(vocab, flatten=False, in_units=hidden)

    def hybrid_forward(self, F, x):
        return self.out(self.lstm(self.embed(x)))


def _zoo(name, size, batch):
    def build():
        from gluoncv.model_zoo import get_model
        return get_model(name, pretrained=False, classes=10)

    def data(rng):
        return (nd.array(rng.uniform(-1, 1, (batch, 3, size, size))),
                nd.array(rng.randint(0, 10, batch)))
    return build, data, gluon.loss.SoftmaxCrossEntropyLoss()


def _transformer():
    def data(rng):
        return nd.array(rng.standard_normal((8, 32, 64))), nd.array(rng.standard_normal((8, 32, 64)))
    return TransformerBlock, data, gluon.loss.L2Loss()


def _lstm():
    def data(rng):
        tokens = rng.randint(0, 200, (8, 33))
        return nd.array(tokens[:, :-1]), nd.array(tokens[:, 1:])
    return LSTMLanguageModel, data, gluon.loss.SoftmaxCrossEntropyLoss(axis=-1)


MODELS = {
    'resnet18_v1': lambda: _zoo('resnet18_v1', 64, 4),
    'mobilenetv2_1.0': lambda: _zoo('mobilenetv2_1.0', 96, 4),
    'densenet121': lambda: _zoo('densenet121', 224, 2),
    'transformer': _transformer,
    'lstm_lm': _lstm,
}


def _init(build, seed, x):
    mx.random.seed(seed)
    net = build()
    net.initialize(mx.init.Xavier())
    net(x)   # shapes (deferred init)
    return net


def _f32(arr):
    return (arr if arr.dtype == np.float32 else nd.amp_cast(arr, dtype='float32')).asnumpy()


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def run(model, seed=0, cast_params=False, steps=3, lr=1e-4):
    """The figures for one model (dict); see the module docstring."""
    if not mxmp.lp_kernels_available('bfloat16'):
        raise SystemExit('no bfloat16 kernels on this CPU (mxmp.lp_kernels_available)')
    start = time.time()
    build, make_data, loss_fn = MODELS[model]()
    rng = np.random.RandomState(seed)
    x, _ = make_data(rng)
    ref = _init(build, seed, x)
    net = _init(build, seed + 1, x)
    mine, theirs = net._collect_params_with_prefix(), ref._collect_params_with_prefix()
    for name, param in mine.items():
        param.set_data(theirs[name].data())
    ref_out = ref(x).asnumpy()
    net(x).wait_to_read()                 # float32 inference forward before converting
    # unfused inference: the bounds are the unfused graph's (fusion: tests/gluon/test_fused_inference.py)
    conv = mxmp.convert(net, 'bfloat16', cast_params=cast_params, fuse_inference=False)
    out = {'model': model, 'seed': seed, 'cast_params': cast_params,
           'rel_err_before': _rel(conv(x).asnumpy(), ref_out), 'rel_err_train': [],
           'grad_rel_err': [], 'loss_f32': [], 'loss_bf16': []}
    trainers = [mxmp.Trainer(b.collect_params(), 'sgd', {'learning_rate': lr,
                                                          'momentum': 0.9})
                for b in (ref, net)]
    names = sorted(theirs)
    for step in range(steps):
        xs, ys = make_data(np.random.RandomState(1000 * seed + step + 1))
        outputs, grads = [], []
        for block, params, trainer, key in ((ref, theirs, trainers[0], 'loss_f32'),
                                            (conv, mine, trainers[1], 'loss_bf16')):
            with autograd.record():
                y = block(xs)
                loss = loss_fn(y, ys)
            loss.backward()
            outputs.append(y.asnumpy())
            grads.append(np.concatenate([_f32(params[n].grad()).ravel() for n in names
                                         if params[n].grad_req != 'null']))
            assert trainer.step(xs.shape[0]), 'step %d of %s skipped' % (step, key)
            out[key].append(float(loss.mean().asscalar()))
        out['rel_err_train'].append(_rel(outputs[1], outputs[0]))
        out['grad_rel_err'].append(float(np.linalg.norm(grads[1] - grads[0]) /
                                         np.linalg.norm(grads[0])))
    out['rel_err_after'] = _rel(conv(x).asnumpy(), ref(x).asnumpy())
    out['seconds'] = round(time.time() - start, 2)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('model', choices=sorted(MODELS))
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--cast-params', action='store_true')
    parser.add_argument('--steps', type=int, default=3)
    parser.add_argument('--lr', type=float, default=1e-4, help='SGD learning rate')
    args = parser.parse_args(argv)
    print(json.dumps(run(args.model, args.seed, args.cast_params, args.steps, args.lr)))


if __name__ == '__main__':
    main()
