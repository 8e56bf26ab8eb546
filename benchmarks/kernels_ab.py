"""Interleaved A/B timing of mxmp's operator library on a BERT model, in one process.

    python -m benchmarks.kernels_ab [--model bert_base] [--batch-size 8] [--seq-len 128] \
        [--rounds 6] [--warmup 2] [--phase train|infer] [--modes float32,mxmp_mxnet_kernels,mxmp]

Copies of the model with the same weights, one per mode (float32; ``mxmp_mxnet_kernels``: mxmp
bfloat16 with MXNet's kernels, ``Policy(kernels='mxnet')``; ``mxmp``: with the library, the
default ``kernels='auto'``; ``mxmp_all_kernels``: ``kernels='all'``, also the opt-in ``batch_dot``;
``mxmp_fp32_attention``: the default with MXNet's float32 attention matmuls, ``fp32_ops``)
take one training step (SGD, batch of synthetic tokens, softmax cross-entropy) or one inference
call each per round, in an order that rotates every round, so that a shared machine's load falls
on all alike. Prints one JSON line: the per-round times and, per mode, the median of its
per-round ratio to float32 (> 1: faster; float32 is always run), ``x_mxnet_kernels`` (mxmp
against mxmp_mxnet_kernels), ``x_auto_kernels`` (mxmp_all_kernels against mxmp) and
``x_float32_mxmp_kernels`` (mxmp against ``float32_mxmp_kernels``: float32 on the library's
kernels, :mod:`benchmarks.float32_kernels`, what bfloat16 itself buys) and ``x_fp32_attention``
(mxmp against mxmp_fp32_attention: what the library's bfloat16 attention matmuls buy) and
``x_residual_target`` (``mxmp_residual_target``, the default with
``Policy(residual_dtype='target')``, against mxmp) where both ran. Run it with OMP_NUM_THREADS
set (one thread for the one-core figures).
"""
import argparse
import json
import statistics
import time

import numpy as np


#: mode -> Policy(kernels=...) (None: float32, not converted; float32_mxmp_kernels: float32 on
#: the library's kernels, benchmarks.float32_kernels)
KERNELS = {'float32': None, 'float32_mxmp_kernels': None, 'mxmp_mxnet_kernels': 'mxnet',
           'mxmp': 'auto', 'mxmp_all_kernels': 'all', 'mxmp_fp32_attention': 'auto',
           'mxmp_residual_target': 'auto'}
#: mxmp_fp32_attention: the default kernels with MXNet's float32 attention matmuls (fp32_ops),
#: as before the library had them
ATTENTION_OPS = ('_contrib_interleaved_matmul_selfatt_qk',
                 '_contrib_interleaved_matmul_selfatt_valatt')
FLOAT32_MODES = ('float32', 'float32_mxmp_kernels')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--model', default='bert_base')
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--seq-len', type=int, default=128)
    p.add_argument('--rounds', type=int, default=6)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--phase', default='train', choices=('train', 'infer'))
    p.add_argument('--modes', default='float32,mxmp_mxnet_kernels,mxmp',
                   help='comma-separated, of: ' + ', '.join(KERNELS))
    args = p.parse_args(argv)
    modes = ['float32'] + [m for m in args.modes.split(',') if m and m != 'float32']
    bad = [m for m in modes if m not in KERNELS]
    if bad:
        p.error('unknown mode(s) %s: choose from %s' % (', '.join(bad), ', '.join(KERNELS)))
    import mxnet as mx
    from mxnet import autograd, gluon
    import mxmp
    from benchmarks.bert import DATA_NAMES, bert_inputs, bert_labels, build_bert
    from benchmarks.float32_kernels import float32_library_kernels
    ctx = mx.cpu()
    rng = np.random.RandomState(0)
    data = bert_inputs(mx, args.model, args.batch_size, args.seq_len, ctx, rng)
    label = bert_labels(mx, args.batch_size, ctx, rng)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    nets, steps = {}, {}
    for mode in modes:
        net = build_bert(args.model)
        net.initialize(mx.init.Normal(0.02), ctx=ctx)
        net(*data)
        if nets:   # the same weights in every copy
            first = list(nets.values())[0].collect_params().values()
            for a, b in zip(first, net.collect_params().values()):
                b.set_data(a.data())
        if mode == 'float32_mxmp_kernels':
            net = float32_library_kernels(net, DATA_NAMES)
        elif mode != 'float32':
            fp32 = ATTENTION_OPS if mode == 'mxmp_fp32_attention' else ()
            residual = 'target' if mode == 'mxmp_residual_target' else 'float32'
            net = mxmp.convert(net, 'bfloat16', policy=mxmp.Policy(
                'bfloat16', kernels=KERNELS[mode], fp32_ops=fp32, residual_dtype=residual))
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = (mxmp.Trainer if mode not in FLOAT32_MODES else gluon.Trainer)(
            net.collect_params(), 'sgd', {'learning_rate': 1e-4, 'momentum': 0.9})
        nets[mode] = net

        def step(net=net, trainer=trainer):
            if args.phase == 'infer':
                net(*data).wait_to_read()
                return
            with autograd.record():
                loss = loss_fn(net(*data), label)
            loss.backward()
            trainer.step(args.batch_size)
            mx.nd.waitall()
        steps[mode] = step
    order = list(steps)
    times = {m: [] for m in order}
    for r in range(args.warmup + args.rounds):
        for mode in order[r % len(order):] + order[:r % len(order)]:
            start = time.perf_counter()
            steps[mode]()
            if r >= args.warmup:
                times[mode].append(time.perf_counter() - start)
    ratios = {m: statistics.median(f / t for f, t in zip(times['float32'], times[m]))
              for m in order}
    result = {'phase': args.phase, 'times_s': times, 'x_float32': ratios}
    for key, slow, fast in (('x_mxnet_kernels', 'mxmp_mxnet_kernels', 'mxmp'),
                            ('x_auto_kernels', 'mxmp', 'mxmp_all_kernels'),
                            ('x_float32_mxmp_kernels', 'float32_mxmp_kernels', 'mxmp'),
                            ('x_fp32_attention', 'mxmp_fp32_attention', 'mxmp'),
                            ('x_residual_target', 'mxmp', 'mxmp_residual_target')):
        if slow in times and fast in times:
            result[key] = statistics.median(a / b for a, b in zip(times[slow], times[fast]))
    print(json.dumps(result))


if __name__ == '__main__':
    main()
