#!/usr/bin/env python3
"""Characters or words for the transformer accuracy study: vocabulary sizes of the King James
Bible and the float32 cost of a training step of the study's GPT with each output layer.

    python -m benchmarks.gpt_vocab            # ~1 minute, one thread

Prints the number of distinct characters and of distinct whitespace-separated words of
``bible gen1:1-rev22:21``, then, for the study's model (benchmarks/gpt.py: 3 layers, 128 units,
4 heads, context 128, dropout 0.1) with a 73-character and with a word-sized output layer, the
median seconds of a float32 Adam step over 4,096 tokens (batch 32 x 128), measured side by side
in this process (steps after the first; random token ids).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def step_seconds(vocab_size, steps, context=128, batch=32):
    """Median seconds of a float32 training step (forward, backward, Adam) of the study's GPT
    with a ``vocab_size`` output layer, over ``steps`` steps after a first untimed one."""
    import mxnet as mx
    import numpy as np
    from mxnet import autograd, gluon
    from benchmarks import gpt
    mx.random.seed(0)
    net = gpt.build_gpt(vocab_size, 128, 3, 4, context, 0.1)
    net.initialize(mx.init.Normal(0.02))
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), 'adam', {'learning_rate': 1e-3})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(axis=-1)
    mask = mx.nd.array(gpt.causal_mask(context))
    x = mx.nd.array(np.random.RandomState(0).randint(0, vocab_size, (context, batch)))
    times = []
    for _ in range(steps + 1):
        tic = time.time()
        with autograd.record():
            loss = loss_fn(net(x, mask), x).mean()
        loss.backward()
        trainer.step(1)
        loss.asscalar()
        times.append(time.time() - tic)
    return float(np.median(times[1:]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=5, help='timed steps per vocabulary')
    args = p.parse_args(argv)
    from benchmarks import gpt
    text = gpt.load_bible()
    chars, words = len(set(text)), len(set(text.split()))
    print('distinct characters: %d; distinct whitespace-separated words: %d' % (chars, words))
    char_s, word_s = step_seconds(chars, args.steps), step_seconds(words, args.steps)
    print('float32 step, 4,096 tokens: %d-character output %.3f s, %d-word output %.3f s '
          '(%.1fx)' % (chars, char_s, words, word_s, word_s / char_s))


if __name__ == '__main__':
    main()
