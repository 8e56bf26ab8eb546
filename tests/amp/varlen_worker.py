"""Worker of tests/amp/test_variable_length.py: a bucketed BERT loop whose batches change
sequence length on most steps, to bound what a new input shape costs a converted network.

    python -m tests.amp.varlen_worker MODE [--batches N] [--max-len L] [--seed S] [--infer]

MODE ``float32`` (no mxmp), ``convert`` (``mxmp.convert(net, 'bfloat16')``, emulated where the
kernels are missing) or ``amp`` (``mxmp.amp.init('bfloat16')``). Each batch: 1 sequence of a
random length in 1..L; a training step (forward, backward, ``trainer.step``), or with
``--infer`` an inference call (where the real kernels run, mxmp's fused twin). Prints one JSON
line: the resident set size (MiB, /proc/self/statm) after every 100 batches, the number of
distinct lengths, of distinct graphs mxmp built (``converted_graph``) and fused twins it ran
(``fused_graph``), and the median seconds of calls on a length seen for the first time and on
a length seen before (process CPU time).
"""
import argparse
import json
import os
import statistics
import time

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

from tests.amp.bert_finetune_worker import VOCAB, build


def rss_mib():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2.0 ** 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument('mode', choices=['float32', 'convert', 'amp'])
    p.add_argument('--batches', type=int, default=1000)
    p.add_argument('--max-len', type=int, default=64)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--infer', action='store_true')
    args = p.parse_args()
    import mxmp
    from mxmp import amp
    if args.mode == 'amp':
        amp.init(target_dtype='bfloat16')
    net = build(0, max_length=args.max_len)
    if args.mode == 'convert':
        net = mxmp.convert(net, 'bfloat16')
    net.hybridize(static_alloc=True)
    trainer = gluon.Trainer(net.collect_params(), 'adam', {'learning_rate': 1e-4})
    if args.mode == 'amp':
        amp.init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCELoss()
    rng = np.random.RandomState(args.seed)
    seen, first, again, rss = set(), [], [], []
    graphs, fused = [], []   # the distinct converted and fused Symbols the calls ran
    for k in range(args.batches):
        length = int(rng.randint(1, args.max_len + 1))
        ids = mx.nd.array(rng.randint(0, VOCAB, size=(1, length)))
        types, valid = mx.nd.zeros((1, length)), mx.nd.array([length])
        label = mx.nd.array([length % 2])
        start = time.process_time()
        if args.infer:
            net(ids, types, valid).wait_to_read()
        else:
            with autograd.record():
                loss = loss_fn(net(ids, types, valid), label)
                if args.mode == 'amp':
                    with amp.scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
                else:
                    loss.backward()
            trainer.step(1)
            mx.nd.waitall()
        (again if length in seen else first).append(time.process_time() - start)
        seen.add(length)
        if args.mode != 'float32':
            from mxmp._src.gluon import fused_graph
            for found, sym in ((graphs, mxmp.converted_graph(net)), (fused, fused_graph(net))):
                if sym is not None and not any(sym is g for g in found):
                    found.append(sym)
        if (k + 1) % 100 == 0:
            rss.append(round(rss_mib(), 1))
    print(json.dumps({'rss_mib': rss, 'distinct': len(seen), 'graphs': len(graphs),
                      'fused': len(fused),
                      'first_s': statistics.median(first),
                      'again_s': statistics.median(again) if again else None}))


if __name__ == '__main__':
    main()
