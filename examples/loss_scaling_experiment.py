#!/usr/bin/env python3
"""Why float16 training needs loss scaling: gradients flushed to zero, measured per layer.

Three runs of the same small convnet, from the same initial weights, on the same batches:

1. ``float32``: the reference;
2. ``float16, no loss scaling``: ``mxmp.convert(net, 'float16', emulate=True)`` and
   ``mxmp.Trainer(..., loss_scaler='none')``;
3. ``float16, dynamic loss scaling``: the same graph with a ``DynamicLossScaler`` (start
   2**16, /2 and skip the step on overflow, x2 after ``--growth-interval`` finite steps:
   default 50 here instead of the library's 2000, so that the scale can grow within a short
   run).

float16 is *emulated* (float32 kernels whose inputs, outputs and gradients are rounded through
float16, see :mod:`mxmp._src.graph`), so this runs on any CPU and shows where a GPU's float16 graph
would flush gradients to zero (float16's smallest subnormal is 2**-24; anything below 2**-25
becomes 0).

**Flushed-to-zero fraction**, per parameter: at every measured step, before the update, the
float32 gradient is computed on the same weights and batch (the float32 block shares the
Parameters of the converted one); an element counts as *flushed* when it is nonzero in that
float32 reference and exactly zero in the float16-emulated gradient. The fraction is
``flushed / nonzero-in-float32``, summed over the measured steps. Gradients of the scaled run
are measured before the Trainer divides by the loss scale (so what is counted is what float16
can hold).

**Tiny gradients on purpose.** A small convnet on 28x28 images has gradients well inside
float16's range, so the experiment multiplies the loss by ``--loss-factor`` (default 2**-22)
and the optimizer's ``rescale_grad`` by its inverse: the float32 run trains exactly as without
the factor, while the float16 gradients land where those of large detection networks are.
Micikevicius et al., "Mixed Precision Training", ICLR 2018, section 3.2 and figure 3: in
SSD, 67% of the activation-gradient values were zero in float16, and training diverged
without loss scaling. The factor is printed with the results.

Usage::

    python examples/loss_scaling_experiment.py                       # synthetic data, ~1 min
    python examples/loss_scaling_experiment.py --data rec \\
        --rec data/fashion-mnist/train.rec --steps 300                # prepared Fashion-MNIST

Output: a per-layer table and a loss summary on the log, and ``--out`` (JSON: arguments,
per-run losses, per-parameter flushed fractions, loss scale and skipped steps).
"""
import argparse
import json
import logging
import math
import os
import sys
import time

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon, nd

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
import mxmp  # noqa: E402  (the work tree's mxmp when not installed)
from mxmp._src.scaling import DynamicLossScaler  # noqa: E402
from mxmp._src.training.trainer import Trainer  # noqa: E402

LOG = logging.getLogger('loss_scaling_experiment')

RUNS = (('float32', None, 'none'),
        ('float16 no scaling', 'float16', 'none'),
        ('float16 dynamic scaling', 'float16', 'dynamic'))

# Fashion-MNIST training set statistics on the 0-1 scale (mean 0.2860, std 0.3530).
FM_MEAN, FM_STD = 0.2860, 0.3530


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--data', choices=('synthetic', 'rec'), default='synthetic',
                   help='synthetic class templates + noise, or a RecordIO file (--rec)')
    p.add_argument('--signal', type=float, default=0.3,
                   help='synthetic data: amplitude of the class templates against unit noise '
                        '(larger is easier)')
    p.add_argument('--rec', default='data/fashion-mnist/train.rec',
                   help='RecordIO written by scripts/prepare_fashion_mnist.py (--data rec)')
    p.add_argument('--steps', type=int, default=200, help='training steps per run')
    p.add_argument('--batch-size', type=int, default=64)
    p.add_argument('--lr', type=float, default=0.02)
    p.add_argument('--momentum', type=float, default=0.9)
    p.add_argument('--loss-factor', type=float, default=2.0 ** -22,
                   help='the loss is multiplied by this (and rescale_grad by its inverse) to '
                        'make gradients as small as in large detection networks')
    p.add_argument('--growth-interval', type=int, default=50,
                   help='finite steps before the dynamic loss scale doubles (library default '
                        '2000, made for long runs: in a few hundred steps it would never grow '
                        'from its start of 2**16)')
    p.add_argument('--measure-every', type=int, default=1,
                   help='measure flushed fractions every N steps (each costs one float32 '
                        'forward/backward)')
    p.add_argument('--tail', type=int, default=20,
                   help='the final loss is the mean over the last N steps')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default='runs/loss_scaling_experiment/results.json',
                   help='JSON file to write')
    p.add_argument('--log-level', default='INFO')
    args = p.parse_args(argv)
    for name in ('steps', 'batch_size', 'measure_every', 'tail', 'growth_interval'):
        if getattr(args, name) < 1:
            p.error('--%s must be >= 1' % name.replace('_', '-'))
    if not (args.loss_factor > 0 and math.isfinite(args.loss_factor)):
        p.error('--loss-factor must be a positive finite number')
    if args.data == 'rec' and not os.path.isfile(args.rec):
        p.error('%s not found: write it with "python scripts/prepare_fashion_mnist.py --out '
                'data/fashion-mnist", or use --data synthetic' % args.rec)
    return args


# ------------------------------------------------------------------------------------ data
def synthetic_batches(steps, batch_size, seed, signal=0.3, channels=1):
    """``steps`` batches of 28x28 images: ``signal`` times a fixed random template per class,
    plus standard normal noise."""
    rng = np.random.RandomState(seed)
    templates = rng.standard_normal((10, channels, 28, 28)).astype(np.float32)
    batches = []
    for _ in range(steps):
        y = rng.randint(0, 10, size=batch_size)
        x = signal * templates[y] + rng.standard_normal((batch_size, channels, 28, 28))
        batches.append((x.astype(np.float32), y.astype(np.float32)))
    return batches


def rec_batches(path, steps, batch_size, seed):
    """``steps`` batches from a RecordIO file (cycled), normalised with Fashion-MNIST's stats."""
    it = mx.io.ImageRecordIter(path_imgrec=path, data_shape=(3, 28, 28), batch_size=batch_size,
                               shuffle=True, seed=seed, preprocess_threads=1)
    batches = []
    while len(batches) < steps:
        try:
            batch = it.next()
        except StopIteration:
            it.reset()
            continue
        n = batch_size - batch.pad
        x = (batch.data[0].asnumpy()[:n, :1] / 255.0 - FM_MEAN) / FM_STD  # gray: 1 channel
        batches.append((x.astype(np.float32), batch.label[0].asnumpy()[:n]))
    return batches


# ----------------------------------------------------------------------------------- model
def make_net(seed, in_channels=1):
    """Conv(8)-pool-Conv(16)-pool-Dense(64)-Dense(10); no BatchNorm (its running statistics
    would be updated by the extra float32 measuring pass), no dropout: deterministic."""
    net = gluon.nn.HybridSequential(prefix='net_')
    with net.name_scope():
        net.add(gluon.nn.Conv2D(8, 3, padding=1, in_channels=in_channels, activation='relu'),
                gluon.nn.MaxPool2D(2),
                gluon.nn.Conv2D(16, 3, padding=1, in_channels=8, activation='relu'),
                gluon.nn.MaxPool2D(2),
                gluon.nn.Dense(64, in_units=16 * 7 * 7, activation='relu'),
                gluon.nn.Dense(10, in_units=64))
    mx.random.seed(seed)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    return net


# -------------------------------------------------------------------------------- training
def gradients(params):
    return {name: p.grad().asnumpy().copy() for name, p in params.items()}


def run(name, target_dtype, loss_scaler, batches, args):
    """One training run; returns its record (losses, flushed counts, scaler state)."""
    in_channels = batches[0][0].shape[1]
    net = make_net(args.seed, in_channels)
    params = net.collect_params()
    # the float32 graph of the same Parameters (mxmp.convert converts net itself)
    data = mx.sym.var('data')
    reference = gluon.SymbolBlock(net(data), [data], params=params)
    if target_dtype is not None:
        mxmp.convert(net, target_dtype, emulate=True)
    spec = loss_scaler
    if loss_scaler == 'dynamic':
        loss_scaler = DynamicLossScaler(growth_interval=args.growth_interval)
    trainer = Trainer(params, 'sgd', {'learning_rate': args.lr, 'momentum': args.momentum,
                                      'rescale_grad': 1.0 / args.loss_factor},
                      loss_scaler=loss_scaler, target_dtype=target_dtype or 'float32')
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    flushed = {k: 0 for k in params}
    nonzero = {k: 0 for k in params}
    mass_lost = {k: 0.0 for k in params}   # sum of |float32 gradient| over flushed elements
    mass = {k: 0.0 for k in params}
    losses, scales, measured = [], [], 0
    start = time.time()
    for step, (x_np, y_np) in enumerate(batches):
        x, y = nd.array(x_np), nd.array(y_np)
        measure = target_dtype is not None and step % args.measure_every == 0
        if measure:
            with autograd.record():
                ref_loss = loss_fn(reference(x), y) * args.loss_factor
            ref_loss.backward()
            ref_grads = gradients(params)
        with autograd.record():
            loss = loss_fn(net(x), y)
            with trainer.scale_loss(loss * args.loss_factor) as scaled:
                scaled.backward()
        if measure:
            for k, g in gradients(params).items():
                live = ref_grads[k] != 0
                lost = live & (g == 0)
                nonzero[k] += int(live.sum())
                flushed[k] += int(lost.sum())
                mass[k] += float(np.abs(ref_grads[k]).sum())
                mass_lost[k] += float(np.abs(ref_grads[k][lost]).sum())
            measured += 1
        scales.append(trainer.loss_scale)
        trainer.step(x.shape[0])
        losses.append(float(loss.mean().asscalar()))
    record = {
        'name': name, 'target_dtype': target_dtype or 'float32', 'emulate': bool(target_dtype),
        'loss_scaler': spec, 'loss_scaler_config': trainer.loss_scaler.state_dict(),
        'losses': losses,
        'final_loss': float(np.mean(losses[-args.tail:])),
        'initial_loss': float(np.mean(losses[:min(args.tail, len(losses))])),
        'final_loss_scale': trainer.loss_scale, 'loss_scales': scales,
        'skipped_steps': trainer.skipped_steps, 'measured_steps': measured,
        'seconds': time.time() - start,
    }
    if measured:
        record['flushed_fraction'] = {k: flushed[k] / nonzero[k] if nonzero[k] else 0.0
                                      for k in params}
        record['flushed_elements'] = flushed
        record['nonzero_in_float32'] = nonzero
        record['flushed_fraction_all'] = sum(flushed.values()) / max(1, sum(nonzero.values()))
        record['flushed_gradient_mass'] = {k: mass_lost[k] / mass[k] if mass[k] else 0.0
                                           for k in params}
    LOG.info('%-24s loss %.4f -> %.4f (mean of first/last %d steps), skipped %d, loss scale %g,'
             ' %.1fs', name, record['initial_loss'], record['final_loss'], args.tail,
             record['skipped_steps'], record['final_loss_scale'], record['seconds'])
    return record


def _percent(fraction):
    value = 100.0 * fraction
    return '%.1f%%' % value if value >= 0.1 or value == 0 else '%.2g%%' % value


def format_table(results, shapes):
    """Per-parameter flushed-to-zero fractions of the float16 runs: share of the elements
    nonzero in float32 that are zero in float16, and share of the float32 gradient's L1 mass
    they carry."""
    runs = [r for r in results if 'flushed_fraction' in r]
    header = ['parameter', 'shape']
    for r in runs:
        label = r['name'][len('float16 '):]
        header += ['flushed (%s)' % label, 'of |grad| (%s)' % label]
    rows = [header]
    for k, shape in shapes.items():
        row = [k, 'x'.join(map(str, shape))]
        for r in runs:
            row += [_percent(r['flushed_fraction'][k]), _percent(r['flushed_gradient_mass'][k])]
        rows.append(row)
    total = ['all', '']
    for r in runs:
        total += [_percent(r['flushed_fraction_all']), '']
    rows.append(total)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ['  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format='%(message)s')
    if args.data == 'synthetic':
        batches = synthetic_batches(args.steps, args.batch_size, args.seed, args.signal)
    else:
        batches = rec_batches(args.rec, args.steps, args.batch_size, args.seed)
    LOG.info('data: %s, %d steps of %d images; loss multiplied by %g (= 2**%g) and rescale_grad '
             'by %g so that gradients are as small as in large detection networks '
             '(Micikevicius et al. 2018, SSD); float16 is emulated on %s',
             args.data if args.data == 'synthetic' else args.rec, args.steps, args.batch_size,
             args.loss_factor, math.log2(args.loss_factor), 1 / args.loss_factor, mx.cpu())
    results = [run(name, dtype, scaler, batches, args) for name, dtype, scaler in RUNS]
    shapes = {k: p.shape for k, p in make_net(args.seed, batches[0][0].shape[1])
              .collect_params().items()}
    LOG.info('gradient elements nonzero in float32 but zero in emulated float16 (per '
             'parameter, %d measured steps):\n%s', results[1]['measured_steps'],
             format_table(results, shapes))
    f32, plain, scaled = results
    summary = {
        'float32_final_loss': f32['final_loss'],
        'float16_no_scaling_final_loss': plain['final_loss'],
        'float16_dynamic_scaling_final_loss': scaled['final_loss'],
        'max_flushed_fraction_no_scaling': max(plain['flushed_fraction'].values()),
        'max_flushed_fraction_dynamic_scaling': max(scaled['flushed_fraction'].values()),
        'note': 'loss multiplied by %g and rescale_grad by %g to make gradients tiny on '
                'purpose (as in SSD, Micikevicius et al. 2018); float16 emulated with float32 '
                'kernels (mxmp emulate=True)' % (args.loss_factor, 1 / args.loss_factor),
    }
    LOG.info('final loss (mean of last %d steps): float32 %.4f | float16 no scaling %.4f | '
             'float16 dynamic scaling %.4f', args.tail, summary['float32_final_loss'],
             summary['float16_no_scaling_final_loss'],
             summary['float16_dynamic_scaling_final_loss'])
    out = {'args': vars(args), 'summary': summary, 'runs': results,
           'parameter_shapes': {k: list(v) for k, v in shapes.items()}}
    directory = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(directory, exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(out, f, indent=1)
    LOG.info('wrote %s', args.out)
    return out


if __name__ == '__main__':
    main()
