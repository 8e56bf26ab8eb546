"""Worker of tests/amp/test_trainer_state.py: a contrib.amp-style training loop that saves and
restores contrib.amp's loss-scaler fields as published training code does (Sockeye 2.x's
``training.py`` pickles ``[_loss_scale, _next_loss_scale, _unskipped]`` beside its parameters
and optimizer states, sets ``_scale_seq_len`` right after ``amp.init_trainer``, and restores the
three fields with one tuple assignment).

    python -m tests.amp.trainer_state_worker DTYPE --steps N [--save-at K --dir D] [--resume D]
        [--dynamic] [--seq-len L]

DTYPE ``float16`` (emulated on a CPU, dynamic scaling, mxmp's default) or ``bfloat16``
(``--dynamic``: ``amp.init(mxmp.Policy('bfloat16', loss_scaler='dynamic'))``, else no scaling).
Runs steps ``[0, N)``, or ``[K, N)`` after ``--resume D``; ``--save-at K`` writes the state
after step K-1 and stops. Prints one JSON line: per step the loss (float.hex of the float32
sum), the fields read after the step, whether it was skipped; then a digest of the final
weights. Run from the repository root.
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

BATCH, FEATURES, CLASSES = 32, 16, 8


def batch(step):
    rng = np.random.RandomState(1000 + step)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32) * 4
    return mx.nd.array(x), mx.nd.array(rng.randint(0, CLASSES, size=BATCH))


def build():
    mx.random.seed(7)
    net = nn.HybridSequential()
    net.add(nn.Dense(64, in_units=FEATURES, activation='relu'),
            nn.Dense(64, in_units=64, activation='relu'), nn.Dense(CLASSES, in_units=64))
    net.initialize(mx.init.Xavier())
    return net


def fields(scaler):
    return {'loss_scale': scaler._loss_scale, 'next': scaler._next_loss_scale,
            'unskipped': scaler._unskipped, 'seq_len': scaler._scale_seq_len,
            'max': scaler._max_loss_scale}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('dtype', choices=['float16', 'bfloat16'])
    parser.add_argument('--steps', type=int, required=True)
    parser.add_argument('--save-at', type=int)
    parser.add_argument('--dir')
    parser.add_argument('--resume')
    parser.add_argument('--dynamic', action='store_true')
    parser.add_argument('--seq-len', type=int, default=3)
    args = parser.parse_args()

    import mxmp
    from mxmp import amp
    amp.init(mxmp.Policy(args.dtype, loss_scaler='dynamic') if args.dynamic else args.dtype)
    net = build()
    start = 0
    if args.resume:
        net.load_parameters(os.path.join(args.resume, 'params'))
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), 'adam', {'learning_rate': 1e-3})
    amp.init_trainer(trainer)
    trainer._amp_loss_scaler._scale_seq_len = args.seq_len      # as Sockeye, after init_trainer
    if args.resume:
        trainer.load_states(os.path.join(args.resume, 'trainer.states'))
        with open(os.path.join(args.resume, 'amp.pkl'), 'rb') as fp:
            (trainer._amp_loss_scaler._loss_scale,
             trainer._amp_loss_scaler._next_loss_scale,
             trainer._amp_loss_scaler._unskipped), start = pickle.load(fp)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    scaler = trainer._amp_loss_scaler
    steps = []
    stop = args.save_at if args.save_at is not None else args.steps
    for step in range(start, stop):
        x, y = batch(step)
        skipped = scaler.skipped_steps
        with autograd.record():
            loss = loss_fn(net(x), y).sum()
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(1)
        steps.append(dict(fields(scaler), step=step, loss=float(loss.asscalar()).hex(),
                          skipped=scaler.skipped_steps > skipped))
    if args.save_at is not None:
        os.makedirs(args.dir, exist_ok=True)
        net.save_parameters(os.path.join(args.dir, 'params'))
        trainer.save_states(os.path.join(args.dir, 'trainer.states'))
        with open(os.path.join(args.dir, 'amp.pkl'), 'wb') as fp:
            pickle.dump([[scaler._loss_scale, scaler._next_loss_scale, scaler._unskipped],
                         args.save_at], fp)
    digest = hashlib.sha256()
    for name, p in sorted(net.collect_params().items()):
        digest.update(p.data().asnumpy().tobytes())
    print(json.dumps({'steps': steps, 'weights': digest.hexdigest()}))


if __name__ == '__main__':
    main()
