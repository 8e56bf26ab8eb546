"""Worker of tests/amp/test_bert_finetune.py: GluonNLP 0.10 BERT classification fine-tuning with
the calls of GluonNLP's ``scripts/bert/finetune_classifier.py`` (random weights, small config).

    python -m tests.amp.bert_finetune_worker MODE [--seed S] [--updates N] [--accumulate A]
        [--save-at K --dir D] [--resume D] [--overflow-at U]

MODE: ``float32`` (no mxmp); ``amp-bfloat16`` / ``amp-float16`` (``mxmp.amp.init(dtype)``,
``gluon.Trainer`` + ``amp.init_trainer``, ``amp.scale_loss``; float16 emulated on a CPU with
dynamic loss scaling); ``convert-bfloat16`` / ``convert-float16`` (``mxmp.convert(net, dtype)``
and ``mxmp.Trainer``, whose ``unscale()`` stands for ``amp.unscale``). The loop, per update:
``zero_grad`` (``grad_req='add'`` when accumulating), A batches of forward + ``scale_loss`` +
``autograd.backward``, then ``trainer.allreduce_grads()``, ``amp.unscale(trainer)``,
``nlp.utils.clip_grad_global_norm(params, 1)`` and ``trainer.update(A)``; ``bertadam``, no weight
decay on LayerNorm and bias terms, as the script. ``--overflow-at U`` makes update U's losses
inf. ``--save-at K`` saves after update K-1 (parameters, Trainer states and the pickled
contrib.amp fields, as Sockeye) and stops; ``--resume D`` continues from it. Prints one JSON
line: per update the mean loss, the global norm clip_grad_global_norm returned, whether it
was skipped, the loss scale; the dtypes of the FullyConnected outputs of the executed graph;
a digest of the weights.
"""
import argparse
import hashlib
import json
import os
import pickle
import warnings

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

VOCAB, UNITS, HIDDEN, LAYERS, HEADS, BATCH, CLASSES = 1000, 64, 128, 2, 2, 8, 2
BFLOAT16 = np.dtype([('bfloat16', np.uint16)])


def build(seed, max_length=64):
    from gluonnlp.model import bert
    mx.random.seed(seed)
    encoder = bert.BERTEncoder(num_layers=LAYERS, units=UNITS, hidden_size=HIDDEN,
                               max_length=max_length, num_heads=HEADS, dropout=0.0)
    model = bert.BERTModel(encoder, VOCAB, token_type_vocab_size=2, units=UNITS,
                           embed_size=UNITS, use_pooler=True, use_decoder=False,
                           use_classifier=False)
    net = bert.BERTClassifier(model, num_classes=CLASSES, dropout=0.0)
    net.initialize(mx.init.Normal(0.02))
    return net


def batch(seed, index):
    """Bucketed lengths: each batch its own sequence length in 8..32."""
    rng = np.random.RandomState(seed * 1000 + index)
    length = int(rng.choice([8, 12, 16, 24, 32]))
    ids = rng.randint(0, VOCAB, size=(BATCH, length))
    types = np.zeros((BATCH, length))
    types[:, length // 2:] = 1
    valid = rng.randint(length // 2, length + 1, size=BATCH)
    label = (ids[:, 0] % 2).astype(np.float32)     # learnable from the first token
    return [mx.nd.array(a) for a in (ids, types, valid, label)]


def fc_dtypes(net):
    inputs, sym = net._cached_graph
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    fcs = {n['name'] + '_output' for n in nodes if n['op'] == 'FullyConnected'}
    internals = sym.get_internals()
    _, types, _ = internals.infer_type_partial(**{i.name: 'float32' for i in inputs})
    counts = {}
    for name, t in zip(internals.list_outputs(), types):
        if name in fcs:
            key = 'bfloat16' if np.dtype(t) == BFLOAT16 else np.dtype(t).name
            counts[key] = counts.get(key, 0) + 1
    rounding = {}   # the casts and rounding nodes to a low-precision dtype (emulation's too)
    for n in nodes:
        attrs = n.get('attrs', {})
        target = attrs.get('__mxmp_round__') or (attrs.get('dtype') if n['op'] == 'amp_cast'
                                                 else None)
        if target in ('float16', 'bfloat16'):
            rounding[target] = rounding.get(target, 0) + 1
    return counts, rounding


def main():
    p = argparse.ArgumentParser()
    p.add_argument('mode', choices=['float32', 'amp-bfloat16', 'amp-float16', 'convert-bfloat16',
                                    'convert-float16'])
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--updates', type=int, default=6)
    p.add_argument('--accumulate', type=int, default=2)
    p.add_argument('--save-at', type=int)
    p.add_argument('--dir')
    p.add_argument('--resume')
    p.add_argument('--overflow-at', type=int, default=-1)
    args = p.parse_args()
    import gluonnlp as nlp
    import mxmp
    from mxmp import amp
    kind, _, dtype = args.mode.partition('-')
    if kind == 'amp':
        amp.init(target_dtype=dtype)
    net = build(args.seed)
    if args.resume:
        net.load_parameters(os.path.join(args.resume, 'params'))
    if kind == 'convert':
        net = mxmp.convert(net, dtype)
    net.hybridize(static_alloc=True)
    opt = ('bertadam', {'learning_rate': 5e-4, 'epsilon': 1e-6})
    if kind == 'convert':
        trainer = mxmp.Trainer(net.collect_params(), *opt, update_on_kvstore=False)
    else:
        trainer = gluon.Trainer(net.collect_params(), *opt, update_on_kvstore=False)
    if kind == 'amp':
        amp.init_trainer(trainer)
    for _, v in net.collect_params('.*beta|.*gamma|.*bias').items():
        v.wd_mult = 0.0
    params = [q for q in net.collect_params().values() if q.grad_req != 'null']
    if args.accumulate > 1:
        for q in params:
            q.grad_req = 'add'
    start = 0
    if args.resume:
        trainer.load_states(os.path.join(args.resume, 'trainer.states'))
        if kind == 'amp':
            with open(os.path.join(args.resume, 'amp.pkl'), 'rb') as fp:
                (trainer._amp_loss_scaler._loss_scale, trainer._amp_loss_scaler._next_loss_scale,
                 trainer._amp_loss_scaler._unskipped), start = pickle.load(fp)
        else:
            with open(os.path.join(args.resume, 'amp.pkl'), 'rb') as fp:
                start = pickle.load(fp)[1]
    loss_fn = gluon.loss.SoftmaxCELoss()
    scaler = getattr(trainer, '_amp_loss_scaler', None)
    skipped = lambda: scaler.skipped_steps if scaler else getattr(trainer, 'skipped_steps', 0)  # noqa
    out = []
    stop = args.save_at if args.save_at is not None else args.updates
    for update in range(start, stop):
        net.collect_params().zero_grad()
        losses = []
        for k in range(args.accumulate):
            ids, types, valid, label = batch(args.seed, update * args.accumulate + k)
            with autograd.record():
                ls = loss_fn(net(ids, types, valid), label).mean()
                if update == args.overflow_at:
                    ls = ls * float('inf')
                if kind == 'float32':
                    ls.backward()
                else:
                    with amp.scale_loss(ls, trainer) as scaled:
                        autograd.backward(scaled)
            losses.append(float(ls.asscalar()))
        before = skipped()
        trainer.allreduce_grads()
        if kind != 'float32':
            amp.unscale(trainer)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')      # clip's warning on a non-finite norm
            norm = nlp.utils.clip_grad_global_norm(params, 1)
        trainer.update(args.accumulate)
        out.append({'update': update, 'loss': float(np.mean(losses)), 'norm': float(norm.asscalar() if hasattr(norm, 'asscalar') else norm),
                    'skipped': skipped() > before,
                    'loss_scale': scaler._loss_scale if scaler else
                    getattr(trainer, 'loss_scale', 1.0),
                    'unskipped': scaler._unskipped if scaler else None})
    if args.save_at is not None:
        os.makedirs(args.dir, exist_ok=True)
        net.save_parameters(os.path.join(args.dir, 'params'))
        trainer.save_states(os.path.join(args.dir, 'trainer.states'))
        fields = [scaler._loss_scale, scaler._next_loss_scale, scaler._unskipped] if scaler \
            else None
        with open(os.path.join(args.dir, 'amp.pkl'), 'wb') as fp:
            pickle.dump([fields, args.save_at], fp)
    digest = hashlib.sha256()
    for name, q in sorted(net.collect_params().items()):
        digest.update(q.data().astype('float32').asnumpy().tobytes())
    fcs, rounding = fc_dtypes(net)
    print(json.dumps({'updates': out, 'fc_dtypes': fcs, 'rounding': rounding,
                      'weights': digest.hexdigest()}))


if __name__ == '__main__':
    main()
