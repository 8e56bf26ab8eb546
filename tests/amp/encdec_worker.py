"""Worker of tests/amp/test_encoder_decoder.py: an encoder-decoder Transformer written with
MXNet's interleaved attention operators (``contrib.interleaved_matmul_selfatt_*`` and
``..._encdec_*``, as GluonNLP's and Sockeye's attention cells use them), trained on a copy task
with bucketed batches (each batch one source length from (6, 10, 14), target = reversed source).

    python -m tests.amp.encdec_worker MODE [--seed S] [--steps N] [--save-at K --dir D]
        [--resume D]

MODE: ``float32``; ``convert-bfloat16`` / ``convert-float16`` (``mxmp.convert(net, dtype)``,
``mxmp.Trainer``; float16 emulated with dynamic loss scaling); ``amp-bfloat16``
(``mxmp.amp.init``, ``gluon.Trainer``, ``amp.init_trainer``/``scale_loss``/``unscale``). Per
step, as GluonNLP's ``train_transformer.py``: forward, scaled backward,
``trainer.allreduce_grads()``, unscale, ``clip_grad_global_norm(params, 1)``,
``trainer.update(1)``. ``--save-at K`` saves parameters and Trainer states after step K-1;
``--resume D`` continues. Prints one JSON line: per step the loss and whether it was skipped;
the FullyConnected output dtypes of the executed graph; a digest of the weights.
"""
import argparse
import hashlib
import json
import os
import pickle

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

from tests.amp.bert_finetune_worker import fc_dtypes

VOCAB, UNITS, HEADS, FFN, BATCH, BUCKETS = 32, 32, 2, 64, 8, (6, 10, 14)


class Attention(nn.HybridBlock):
    def __init__(self, cross, **kwargs):
        super().__init__(**kwargs)
        self.cross = cross
        with self.name_scope():
            self.q = nn.Dense(UNITS, flatten=False) if cross else None
            self.proj_in = nn.Dense(2 * UNITS if cross else 3 * UNITS, flatten=False)
            self.out = nn.Dense(UNITS, flatten=False)

    def hybrid_forward(self, F, x, mem=None, mask=None):   # (length, batch, units)
        if self.cross:
            kv = self.proj_in(mem)
            scores = F.contrib.interleaved_matmul_encdec_qk(self.q(x), kv, heads=HEADS)
        else:
            kv = self.proj_in(x)
            scores = F.contrib.interleaved_matmul_selfatt_qk(kv, heads=HEADS)
        if mask is not None:
            scores = F.broadcast_add(scores, mask)
        att = F.softmax(scores, axis=-1)
        if self.cross:
            ctx = F.contrib.interleaved_matmul_encdec_valatt(kv, att, heads=HEADS)
        else:
            ctx = F.contrib.interleaved_matmul_selfatt_valatt(kv, att, heads=HEADS)
        return self.out(ctx)


class Layer(nn.HybridBlock):
    def __init__(self, decoder, **kwargs):
        super().__init__(**kwargs)
        self.decoder = decoder
        with self.name_scope():
            self.self_att = Attention(False)
            self.cross_att = Attention(True) if decoder else None
            self.ffn1 = nn.Dense(FFN, flatten=False, activation='relu')
            self.ffn2 = nn.Dense(UNITS, flatten=False)
            self.norms = nn.HybridSequential()
            for _ in range(3 if decoder else 2):
                self.norms.add(nn.LayerNorm())

    def hybrid_forward(self, F, x, mem=None, mask=None):
        x = self.norms[0](x + self.self_att(x, None, mask))
        if self.decoder:
            x = self.norms[1](x + self.cross_att(x, mem))
        return self.norms[-1](x + self.ffn2(self.ffn1(x)))


class EncoderDecoder(nn.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Embedding(VOCAB, UNITS)
            self.encoder = Layer(False)
            self.decoder = Layer(True)
            self.proj = nn.Dense(VOCAB, flatten=False)

    def hybrid_forward(self, F, src, tgt_in, causal):   # (batch, length) token ids
        mem = self.encoder(F.transpose(self.embed(src), axes=(1, 0, 2)))
        y = self.decoder(F.transpose(self.embed(tgt_in), axes=(1, 0, 2)), mem, causal)
        return self.proj(F.transpose(y, axes=(1, 0, 2)))   # (batch, length, vocab)


def batch(seed, step):
    rng = np.random.RandomState(seed * 1000 + step)
    length = int(rng.choice(BUCKETS))
    src = rng.randint(2, VOCAB, size=(BATCH, length))
    tgt = np.concatenate([np.ones((BATCH, 1)), src[:, ::-1]], axis=1)   # 1: begin of sequence
    causal = np.triu(np.full((length, length), -1e4), k=1)[None]        # (1, q, k)
    return [mx.nd.array(a) for a in (src, tgt[:, :-1], causal, tgt[:, 1:])]


def main():
    p = argparse.ArgumentParser()
    p.add_argument('mode', choices=['float32', 'convert-bfloat16', 'convert-float16',
                                    'amp-bfloat16'])
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--steps', type=int, default=12)
    p.add_argument('--save-at', type=int)
    p.add_argument('--dir')
    p.add_argument('--resume')
    args = p.parse_args()
    import gluonnlp as nlp
    import mxmp
    from mxmp import amp
    kind, _, dtype = args.mode.partition('-')
    if kind == 'amp':
        amp.init(target_dtype=dtype)
    mx.random.seed(args.seed)
    net = EncoderDecoder()
    net.initialize(mx.init.Xavier())
    src, tgt_in, causal, _ = batch(args.seed, 0)
    net(src, tgt_in, causal)                       # shapes known (deferred init)
    if args.resume:
        net.load_parameters(os.path.join(args.resume, 'params'))
    if kind == 'convert':
        net = mxmp.convert(net, dtype)
    net.hybridize(static_alloc=True)
    trainer_cls = mxmp.Trainer if kind == 'convert' else gluon.Trainer
    trainer = trainer_cls(net.collect_params(), 'adam', {'learning_rate': 3e-3},
                          update_on_kvstore=False)
    if kind == 'amp':
        amp.init_trainer(trainer)
    start = 0
    if args.resume:
        trainer.load_states(os.path.join(args.resume, 'trainer.states'))
        with open(os.path.join(args.resume, 'step.pkl'), 'rb') as fp:
            start = pickle.load(fp)
    params = [q for q in net.collect_params().values() if q.grad_req != 'null']
    loss_fn = gluon.loss.SoftmaxCELoss()
    out = []
    stop = args.save_at if args.save_at is not None else args.steps
    for step in range(start, stop):
        src, tgt_in, causal, label = batch(args.seed, step)
        with autograd.record():
            loss = loss_fn(net(src, tgt_in, causal), label).mean()
            if kind == 'float32':
                loss.backward()
            else:
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
        trainer.allreduce_grads()
        if kind != 'float32':
            amp.unscale(trainer)
        nlp.utils.clip_grad_global_norm(params, 1)
        applied = trainer.update(1)
        out.append({'step': step, 'length': src.shape[1], 'loss': float(loss.asscalar()),
                    'skipped': applied is False})
    if args.save_at is not None:
        os.makedirs(args.dir, exist_ok=True)
        net.save_parameters(os.path.join(args.dir, 'params'))
        trainer.save_states(os.path.join(args.dir, 'trainer.states'))
        with open(os.path.join(args.dir, 'step.pkl'), 'wb') as fp:
            pickle.dump(args.save_at, fp)
    digest = hashlib.sha256()
    for _, q in sorted(net.collect_params().items()):
        digest.update(q.data().astype('float32').asnumpy().tobytes())
    fcs, rounding = fc_dtypes(net)
    print(json.dumps({'steps': out, 'fc_dtypes': fcs, 'rounding': rounding,
                      'weights': digest.hexdigest()}))


if __name__ == '__main__':
    main()
