#!/usr/bin/env python3
"""Train a GluonCV model-zoo classifier on ImageNet-layout RecordIO, in float32 or mixed precision.

The mixed-precision path is the point of this example and is four lines of mxmp (search for
``mxmp.``): convert the initialised block, build an ``mxmp.Trainer``, scale the loss before
``backward()``, step. Everything else is an ordinary Gluon training script whose flags follow
GluonCV's ``scripts/classification/imagenet/train_imagenet.py``.

* float32 (``--dtype float32``) trains with MXNet's plain ``gluon.Trainer``: the baseline does not
  go through mxmp at all, so it is an independent reference for the mixed-precision runs.
* ``--dtype bfloat16`` / ``float16``: ``mxmp.convert(net, target_dtype, cast_params, emulate)``
  after initialisation, ``mxmp.Trainer`` (loss scaling, float32 master weights when
  ``--cast-params``), loss computed in float32 on the block's float32 output. When this CPU has no
  kernels for the target dtype (``mxmp.lp_kernels_available`` is False) the low-precision numerics
  are emulated in float32 kernels (``--emulate``, switched on automatically with a log line).

Data: ``--rec-train``/``--rec-val`` (+ ``.idx``) as written by MXNet's ``tools/im2rec.py`` or
``scripts/prepare_fashion_mnist.py``, read by ``mx.io.ImageRecordIter`` (random crop from a padded
image and random mirror for training, mean/std normalisation); or ``--synthetic`` random NDArrays
for tests and benchmarks.

Outputs in ``--save-dir``: ``train.log``; ``metrics.jsonl`` (one JSON object per training step:
step, epoch, loss, loss_scale, skipped, lr; and one per epoch with the validation accuracy);
``summary.json`` (args, per-epoch metrics, final val top-1, img/s, peak RSS, dtype, emulate);
``checkpoint.json`` + ``epoch-NNNN.params``/``.states`` after every epoch (``--resume`` continues
from the last one).

Example (Fashion-MNIST, see examples/README.md)::

    python scripts/prepare_fashion_mnist.py --out data/fashion-mnist
    python examples/train_imagenet.py --dtype float32 --epochs 2 --save-dir runs/fp32
    python examples/train_imagenet.py --dtype bfloat16 --epochs 2 --save-dir runs/bf16
"""
import json
import logging
import math
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Flags, data, model, records: shared with train_imagenet_module.py (and re-exported from here).
from common import (CHECKPOINT_INDEX, ConfigError, JsonLines, build_model,  # noqa: E402,F401
                    build_parser, count_data, end_epoch, import_mxmp, make_rec_iter,
                    optimizer_params, parse_args, resolve_emulate, run_cli, seed_everything,
                    setup_kvstore, close_kvstore, setup_logging, SyntheticIter, truncate_metrics, write_summary)

LOG = logging.getLogger('train_imagenet')


# ----------------------------------------------------------------------------------------------
# trainer status, checkpoints
# ----------------------------------------------------------------------------------------------

def trainer_status(trainer):
    """(loss scale, skipped steps so far) of a trainer; (1.0, 0) for the float32 gluon.Trainer."""
    return float(getattr(trainer, 'loss_scale', 1.0)), int(getattr(trainer, 'skipped_steps', 0))


def save_file_atomic(path, save):
    """``save(tmp)``, fsync, rename over ``path``: a crash leaves the old file or the new one."""
    tmp = '%s.tmp-%d' % (path, os.getpid())
    try:
        save(tmp)
        with open(tmp, 'rb') as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def error_reason(err):
    """One informative line of an exception (MXNetErrors start with a C++ traceback)."""
    lines = [l.strip() for l in str(err).splitlines() if l.strip()]
    for line in lines:
        if 'Check failed' in line or line.startswith('MXNetError'):
            return line[:300]
    return lines[-1][:300] if lines else type(err).__name__


def run_identity(args):
    """What a checkpoint must agree on with the run that resumes it (checked by --resume)."""
    return {'model': args.model, 'dtype': args.dtype, 'cast_params': bool(args.cast_params),
            'num_classes': args.num_classes, 'input_size': args.input_size,
            'optimizer': args.optimizer}


def save_checkpoint(save_dir, epoch, net, trainer, history, step, keep=2, identity=None):
    """Write epoch-NNNN.params/.states, then point checkpoint.json at them.

    Every file is written to a temporary file, fsynced and renamed (:func:`save_file_atomic`), and
    checkpoint.json is written last: a run killed at any moment leaves checkpoint.json naming a
    complete, earlier pair of files. ``identity`` (:func:`run_identity`) is stored for --resume to
    check."""
    stem = os.path.join(save_dir, 'epoch-%04d' % epoch)
    save_file_atomic(stem + '.params', net.save_parameters)
    save_file_atomic(stem + '.states', trainer.save_states)
    index = {'epoch': epoch, 'step': step, 'params': os.path.basename(stem + '.params'),
             'states': os.path.basename(stem + '.states'), 'history': history,
             'run': identity}

    def write_index(tmp):
        with open(tmp, 'w') as f:
            json.dump(index, f, indent=1)
    save_file_atomic(os.path.join(save_dir, CHECKPOINT_INDEX), write_index)
    old = epoch - keep
    for ext in ('.params', '.states'):
        path = os.path.join(save_dir, 'epoch-%04d%s' % (old, ext))
        if old >= 1 and os.path.exists(path):
            os.remove(path)


def load_checkpoint(save_dir, net, trainer, identity=None):
    """Restore params and trainer states (optimizer, momentum, loss scaler) from checkpoint.json.

    Returns the checkpoint index dict (epoch done, step, per-epoch history). Raises ConfigError,
    naming the file and the fix, when there is no checkpoint, when it was written by a run with
    another model/dtype/--cast-params/... than ``identity``, or when a file is truncated, corrupt
    or does not fit the network; nothing is half-loaded silently."""
    path = os.path.join(save_dir, CHECKPOINT_INDEX)
    fresh = 'run without --resume (or with another --save-dir) to start afresh'
    if not os.path.isfile(path):
        raise ConfigError('--resume: no checkpoint in %s (%s missing); run without --resume first'
                          % (save_dir, CHECKPOINT_INDEX))
    try:
        with open(path) as f:
            index = json.load(f)
        files = [os.path.join(save_dir, index[k]) for k in ('params', 'states')]
        int(index['epoch']), int(index['step']), list(index['history'])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError('--resume: %s is corrupt or truncated (%s); %s'
                          % (path, err, fresh)) from None
    saved = index.get('run')
    if identity is not None and saved is not None and saved != identity:
        diff = ', '.join('--%s %s in the checkpoint but %s now' % (k.replace('_', '-'),
                                                                    saved.get(k), identity[k])
                         for k in sorted(identity) if saved.get(k) != identity[k])
        raise ConfigError('--resume: the checkpoint in %s is from another run (%s); resume with '
                          'the flags of the run that wrote it, or %s' % (save_dir, diff, fresh))
    for file in files:
        if not os.path.isfile(file):
            raise ConfigError('--resume: %s names %s, which is missing; %s' % (path, file, fresh))
    import mxnet as mx
    try:
        net.load_parameters(files[0])
    except (mx.base.MXNetError, AssertionError, ValueError, KeyError) as err:
        raise ConfigError('--resume: cannot load the parameters %s: %s. The file is truncated or '
                          'corrupt, or from another model/dtype; %s'
                          % (files[0], error_reason(err), fresh)) from None
    try:
        trainer.load_states(files[1])
    except (mx.base.MXNetError, ValueError, KeyError, EOFError, pickle.UnpicklingError,
            AttributeError, TypeError) as err:
        raise ConfigError('--resume: cannot load the trainer states %s: %s; %s'
                          % (files[1], error_reason(err), fresh)) from None
    return index

# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------

def evaluate(net, val_iter, max_batches=None):
    """Top-1 accuracy over a validation iterator (padding of the last batch excluded).

    ``max_batches`` (None: all) stops after that many batches: the first images of the set.
    Returns a float in [0, 1].
    """
    import mxnet as mx
    correct, total = 0, 0
    if hasattr(val_iter, 'reset'):
        val_iter.reset()
    for i, batch in enumerate(val_iter):
        if max_batches is not None and i >= max_batches:
            break
        data = batch.data[0].as_in_context(mx.cpu())
        label = batch.label[0].as_in_context(mx.cpu())
        pred = mx.nd.argmax(net(data), axis=1)
        n = data.shape[0] - batch.pad
        hits = (pred[:n] == label[:n].astype(pred.dtype)).sum().asscalar()
        correct += int(hits)
        total += n
    return correct / max(total, 1)


def main(argv=None):
    """Run training; returns the summary dict (also written to --save-dir/summary.json).

    Raises ConfigError on bad input (missing files, batch larger than the data, unknown model).
    """
    parser = build_parser()
    parser.add_argument('--max-val-batches', type=int, default=None,
                        help='validate on the first N batches of --rec-val only (quick runs)')
    args = parse_args(argv, parser)
    if args.max_val_batches is not None and args.max_val_batches < 1:
        raise ConfigError('--max-val-batches must be at least 1')
    os.makedirs(args.save_dir, exist_ok=True)
    setup_logging(args.save_dir)

    import mxnet as mx
    from mxnet import autograd, gluon
    from tqdm import tqdm

    kv = setup_kvstore(args)
    rank, workers = args.part
    steps_per_epoch = count_data(args)
    if args.max_val_batches and args.num_val:
        args.num_val = min(args.num_val, args.max_val_batches * args.batch_size)
    seed_everything(args.seed)
    emulate = False
    if args.dtype != 'float32':
        emulate = resolve_emulate(args)

    # ---- model
    net = build_model(args)
    if args.dtype == 'float32':
        train_net = net
    else:
        mxmp = import_mxmp()
        train_net = mxmp.convert(net, target_dtype=args.dtype, cast_params=args.cast_params,
                                 emulate=emulate)
    # static_alloc: MXNet 1.9.1's CachedOp then keeps the output of every forward node until the
    # backward pass, and an emulated graph rounds each bfloat16 tensor with six elementwise
    # nodes: one training step of the quickstart's wide ResNet took 1,517 MiB peak RSS with it,
    # 1,248 without (float32: 495). Emulation measures accuracy, not speed: docs/benchmark.md,
    # "On a CPU without bfloat16 kernels".
    static = not emulate
    if not static:
        LOG.info('emulated %s: hybridized without static_alloc (which would keep every '
                 "rounding node's output until the backward pass)", args.dtype)
    train_net.hybridize(static_alloc=static, static_shape=static)

    opt_params = optimizer_params(args, steps_per_epoch)
    if args.dtype == 'float32' and workers == 1:
        trainer = gluon.Trainer(net.collect_params(), args.optimizer, opt_params, kvstore=kv)
    elif args.dtype == 'float32':
        # dist: gluon.Trainer either updates on the kvstore (no save_states) or, with
        # update_on_kvstore=False, races its weight broadcast (docs/distributed.md)
        trainer = import_mxmp().Trainer(net.collect_params(), args.optimizer, opt_params,
                                        loss_scaler='none', target_dtype='float32', kvstore=kv)
    else:
        # --loss-scale auto: dynamic for float16, none for bfloat16 (float32's exponent range)
        trainer = mxmp.Trainer(train_net.collect_params(), args.optimizer, opt_params,
                               loss_scaler=args.loss_scale, target_dtype=args.dtype,
                               kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    # ---- resume
    start_epoch, step, history = 0, 0, []
    if args.resume:
        index = load_checkpoint(args.save_dir, net, trainer, run_identity(args))
        start_epoch, step, history = index['epoch'], index['step'], index['history']
        LOG.info('resumed from %s: %d epoch(s) done, step %d',
                 os.path.join(args.save_dir, index['params']), start_epoch, step)
        if start_epoch >= args.epochs:
            LOG.info('nothing to do: checkpoint already at epoch %d of --epochs %d',
                     start_epoch, args.epochs)
    truncate_metrics(os.path.join(args.save_dir, 'metrics.jsonl'), step, start_epoch)
    metrics = JsonLines(os.path.join(args.save_dir, 'metrics.jsonl'))
    if metrics.f.tell() == 0:   # a fresh file: say what runs (mxmp plot titles the figure)
        metrics.write(model=args.model, dtype=args.dtype, emulate=bool(emulate),
                      cast_params=bool(args.cast_params),
                      loss_scale_mode=args.loss_scale if args.dtype != 'float32' else 'none')

    LOG.info('model %s, dtype %s%s%s, batch %d, %d steps/epoch x %d epochs, %d train / %d val '
             'images%s', args.model, args.dtype, ' (emulated)' if emulate else '',
             ' cast-params' if args.cast_params else '', args.batch_size, steps_per_epoch,
             args.epochs, args.num_train, args.num_val, ' (synthetic)' if args.synthetic else '')

    show_bar = not args.no_progress and sys.stderr.isatty()
    for epoch in range(start_epoch, args.epochs):
        seed_everything(args.seed + epoch)
        if args.synthetic:
            train_iter = SyntheticIter(args.batch_size, args.input_size, args.num_classes,
                                       steps_per_epoch, args.seed + epoch + 1000 * rank)
        else:
            train_iter = make_rec_iter(args, train=True, epoch=epoch)

        losses, images, skipped_before = [], 0, trainer_status(trainer)[1]
        bar = tqdm(total=steps_per_epoch, desc='epoch %d/%d' % (epoch + 1, args.epochs),
                   unit='batch', disable=not show_bar, leave=False)
        tic = time.time()
        for i, batch in enumerate(train_iter):
            if i >= steps_per_epoch:
                break
            # ImageRecordIter hands out cpu_pinned arrays; CachedOp wants cpu(0)
            data = batch.data[0].as_in_context(mx.cpu())
            label = batch.label[0].as_in_context(mx.cpu())
            with autograd.record():
                out = train_net(data)  # float32 output in both paths
                loss = loss_fn(out, label)  # so the loss is computed in float32
                if args.dtype == 'float32':
                    loss.backward()
                else:
                    # mxmp: multiply by the loss scale (recorded, hence inside record())
                    with trainer.scale_loss(loss) as scaled:
                        scaled.backward()
            scale = trainer_status(trainer)[0]  # the loss scale this step's backward used
            # dist_sync sums the workers' gradients: divide by the global batch.
            # mxmp: False when an overflow skipped it
            applied = trainer.step(data.shape[0] * workers)
            skipped = applied is False
            loss_value = float(loss.mean().asscalar())
            step += 1
            images += data.shape[0]
            losses.append(loss_value)  # forward loss, also of steps skipped on overflow
            metrics.write(step=step, epoch=epoch + 1, loss=loss_value if math.isfinite(loss_value)
                          else None, loss_scale=scale, skipped=bool(skipped),
                          lr=float(trainer.learning_rate))
            bar.update(1)
            bar.set_postfix(loss='%.3f' % loss_value, scale='%g' % scale)
            if args.log_interval and (i + 1) % args.log_interval == 0 and not show_bar:
                LOG.info('epoch %d batch %d/%d loss %.4f lr %.4g scale %g %.1f img/s',
                         epoch + 1, i + 1, steps_per_epoch, loss_value, trainer.learning_rate,
                         scale, images / (time.time() - tic))
        mx.nd.waitall()
        train_time = time.time() - tic
        bar.close()

        del train_iter  # stop its prefetch threads before validation
        # The validation iterator is made only now: an ImageRecordIter starts decoding as soon as
        # it exists, and one idling beside training cost ~25% of training throughput here.
        if args.synthetic:
            val_iter = SyntheticIter(args.batch_size, args.input_size, args.num_classes, 2,
                                     args.seed + 10**6)
        else:
            val_iter = make_rec_iter(args, train=False, epoch=epoch) if args.rec_val else None
        val_top1 = (evaluate(train_net, val_iter, args.max_val_batches)
                    if val_iter is not None else None)
        del val_iter
        scale, skipped_total = trainer_status(trainer)
        history.append(end_epoch(metrics, epoch + 1, step, losses, images, train_time, scale,
                                 skipped_total - skipped_before, val_top1,
                                 float(trainer.learning_rate)))
        save_checkpoint(args.save_dir, epoch + 1, net, trainer, history, step,
                        identity=run_identity(args))
    metrics.close()

    summary = write_summary(args, history, emulate, step)
    close_kvstore(kv)
    return summary


if __name__ == '__main__':
    run_cli(main)
