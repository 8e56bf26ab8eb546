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
import argparse
import difflib
import json
import logging
import math
import os
import pickle
import random
import resource
import sys
import time

import numpy as np

LOG = logging.getLogger('train_imagenet')

DTYPES = ('float32', 'bfloat16', 'float16')
PREPARE_HINT = 'python scripts/prepare_fashion_mnist.py --out data/fashion-mnist'
# Fashion-MNIST pixel statistics on the 0-255 scale (gray replicated to R, G, B), measured on the
# 60,000 training images: mean 0.2860, std 0.3530.
FASHION_MNIST_MEAN = (72.94, 72.94, 72.94)
FASHION_MNIST_STD = (90.02, 90.02, 90.02)
CHECKPOINT_INDEX = 'checkpoint.json'


class ConfigError(Exception):
    """Bad command-line input or data; the message names the problem and the fix."""


# ----------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------

def _triple(text):
    values = [float(v) for v in text.split(',')]
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise argparse.ArgumentTypeError(
            'expected one value or three comma-separated values (R,G,B)')
    return tuple(values)


def _loss_scale(text):
    if text in ('auto', 'dynamic', 'none'):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "expected 'auto', 'dynamic', 'none' or a positive number, got %r" % text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError('a static loss scale must be a positive finite number')
    return value


def build_parser():
    p = argparse.ArgumentParser(
        description='Train a GluonCV classifier on ImageNet-layout RecordIO in float32 or mixed '
                    'precision (mxmp).',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group('data')
    g.add_argument('--rec-train', default='data/fashion-mnist/train.rec',
                   help='training RecordIO file (its index is --rec-train-idx)')
    g.add_argument('--rec-train-idx', default=None,
                   help='index of --rec-train (default: the .rec path with .idx)')
    g.add_argument('--rec-val', default='data/fashion-mnist/val.rec',
                   help='validation RecordIO file; pass "" to skip validation')
    g.add_argument('--rec-val-idx', default=None,
                   help='index of --rec-val (default: the .rec path with .idx)')
    g.add_argument('--synthetic', action='store_true',
                   help='train on random NDArrays instead of RecordIO (tests, benchmarks)')
    g.add_argument('--synthetic-batches', type=int, default=20,
                   help='training batches per epoch with --synthetic')
    g.add_argument('--input-size', type=int, default=28, help='image side fed to the network')
    g.add_argument('--num-classes', type=int, default=10)
    g.add_argument('--mean-rgb', type=_triple, default=FASHION_MNIST_MEAN,
                   help='per-channel mean on the 0-255 scale (default: Fashion-MNIST)')
    g.add_argument('--std-rgb', type=_triple, default=FASHION_MNIST_STD,
                   help='per-channel std on the 0-255 scale (default: Fashion-MNIST)')
    g.add_argument('--crop-pad', type=int, default=2,
                   help='training augmentation: pad the image by this many pixels and crop '
                        '--input-size at random (0: no random crop)')
    g.add_argument('--no-mirror', action='store_true', help='no random horizontal mirror')
    g.add_argument('-j', '--num-workers', '--data-threads', dest='num_workers', type=int,
                   default=2, help='ImageRecordIter decode/augment threads')
    g = p.add_argument_group('model and precision')
    g.add_argument('--model', default='cifar_resnet20_v1',
                   help='GluonCV model-zoo name (gluoncv.model_zoo.get_model_list())')
    g.add_argument('--dtype', choices=DTYPES, default='float32',
                   help='float32, or the target dtype of mixed precision')
    g.add_argument('--cast-params', action='store_true',
                   help='store low-precision-eligible parameters in the target dtype (mxmp keeps '
                        'float32 master weights)')
    e = g.add_mutually_exclusive_group()
    e.add_argument('--emulate', dest='emulate', action='store_true', default=None,
                   help='emulate the target dtype\'s numerics in float32 kernels (default: on '
                        'exactly when this CPU has no kernels for the target dtype)')
    e.add_argument('--no-emulate', dest='emulate', action='store_false',
                   help='require real low-precision kernels')
    g.add_argument('--loss-scale', type=_loss_scale, default='auto',
                   help="auto (dynamic for float16, none for bfloat16), dynamic, none, or a static "
                        "number")
    g = p.add_argument_group('optimisation')
    g.add_argument('--batch-size', type=int, default=128)
    g.add_argument('--epochs', '--num-epochs', dest='epochs', type=int, default=2)
    g.add_argument('--optimizer', choices=('nag', 'sgd'), default='nag')
    g.add_argument('--lr', type=float, default=0.1, help='peak learning rate')
    g.add_argument('--warmup-epochs', type=float, default=0.0,
                   help='linear warm-up from 0 to --lr, then cosine decay to 0')
    g.add_argument('--wd', type=float, default=1e-4, help='weight decay')
    g.add_argument('--momentum', type=float, default=0.9)
    g.add_argument('--seed', type=int, default=0,
                   help='seeds python random, numpy, mx.random and the data order/augmentation')
    g.add_argument('--kvstore', default='device',
                   choices=('device', 'local', 'dist_sync', 'dist_device_sync'),
                   help='kvstore that reduces the gradients (default device: one process). '
                        'dist_*: run under scripts/launch_local.py; each worker reads its part '
                        'of the data, steps with the global batch (batch size x workers), and '
                        'workers of rank > 0 write to SAVE_DIR/rank<r>')
    g.add_argument('--max-train-batches', type=int, default=None,
                   help='cap the number of training batches per epoch (quick runs)')
    g = p.add_argument_group('output')
    g.add_argument('--save-dir', default='runs/train_imagenet')
    g.add_argument('--resume', action='store_true',
                   help='continue from the last checkpoint in --save-dir')
    g.add_argument('--log-interval', type=int, default=50,
                   help='log a line every N batches (0: only per epoch)')
    g.add_argument('--no-progress', action='store_true', help='no tqdm progress bars')
    return p


def parse_args(argv=None, parser=None):
    """Parse and check the command line; raises ConfigError on values that cannot work.

    ``parser`` (default :func:`build_parser`) lets another script add flags to these.
    """
    args = (parser or build_parser()).parse_args(argv)
    positive = ('batch_size', 'epochs', 'input_size', 'num_classes', 'synthetic_batches',
                'num_workers')
    for name in positive:
        if getattr(args, name) < 1:
            raise ConfigError('--%s must be at least 1, got %d'
                              % (name.replace('_', '-'), getattr(args, name)))
    if args.max_train_batches is not None and args.max_train_batches < 1:
        raise ConfigError('--max-train-batches must be at least 1')
    if not 0 <= args.warmup_epochs < args.epochs:
        raise ConfigError('--warmup-epochs must be in [0, --epochs), got %g with --epochs %d'
                          % (args.warmup_epochs, args.epochs))
    if args.crop_pad < 0:
        raise ConfigError('--crop-pad must be >= 0')
    if args.dtype == 'float32':
        if args.loss_scale not in ('auto', 'none'):
            raise ConfigError('--loss-scale %s applies to mixed precision; pass --dtype bfloat16 '
                              'or float16, or drop --loss-scale' % args.loss_scale)
        if args.cast_params or args.emulate:
            raise ConfigError('--cast-params and --emulate apply to --dtype bfloat16/float16')
    if args.rec_train_idx is None:
        args.rec_train_idx = os.path.splitext(args.rec_train)[0] + '.idx'
    if args.rec_val and args.rec_val_idx is None:
        args.rec_val_idx = os.path.splitext(args.rec_val)[0] + '.idx'
    return args


# ----------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------

def count_records(rec, idx, flag):
    """Number of records of a RecordIO file, from its .idx (one line per record)."""
    for path, what in ((rec, 'RecordIO file'), (idx, 'index file')):
        if not os.path.isfile(path):
            raise ConfigError('%s %s not found (%s). Write Fashion-MNIST in this layout with `%s`, '
                              'or point %s at an im2rec .rec/.idx pair.'
                              % (flag, path, what, PREPARE_HINT, flag))
    with open(idx) as f:
        n = sum(1 for line in f if line.strip())
    if n == 0:
        raise ConfigError('%s: index %s lists no records; rewrite it with `%s`'
                          % (flag, idx, PREPARE_HINT))
    return n


def setup_kvstore(args):
    """The kvstore for --kvstore: an ``mx.kv.KVStore`` for dist_*, else the name.

    Sets ``args.part = (rank, number of workers)`` (read by :func:`count_data` and
    :func:`make_rec_iter`) and moves a rank > 0 worker's output to ``SAVE_DIR/rank<r>``.
    """
    import mxnet as mx
    kv = mx.kv.create(args.kvstore) if args.kvstore.startswith('dist') else args.kvstore
    rank, workers = (kv.rank, kv.num_workers) if not isinstance(kv, str) else (0, 1)
    if rank > 0:   # one output directory per worker
        args.save_dir = os.path.join(args.save_dir, 'rank%d' % rank)
        os.makedirs(args.save_dir, exist_ok=True)
    args.part = (rank, workers)
    return kv


def count_data(args):
    """Set ``args.num_train``/``args.num_val`` (images) and return the training steps per epoch.

    Raises ConfigError when a RecordIO file is missing or holds fewer records than a batch.
    """
    if args.synthetic:
        steps_per_epoch = args.synthetic_batches
        if args.max_train_batches:
            steps_per_epoch = min(steps_per_epoch, args.max_train_batches)
        args.num_train = steps_per_epoch * args.batch_size
        args.num_val = args.batch_size * 2
        return steps_per_epoch
    args.num_train = count_records(args.rec_train, args.rec_train_idx, '--rec-train')
    if args.batch_size > args.num_train:
        raise ConfigError('--batch-size %d is larger than the %d records of %s; lower '
                          '--batch-size or write more records (scripts/prepare_fashion_mnist.py'
                          ' --max-train)' % (args.batch_size, args.num_train, args.rec_train))
    args.num_val = (count_records(args.rec_val, args.rec_val_idx, '--rec-val')
                    if args.rec_val else 0)
    args.num_train //= getattr(args, 'part', (0, 1))[1]   # this worker's part (--kvstore dist)
    steps_per_epoch = args.num_train // args.batch_size  # round_batch: last partial batch
    steps_per_epoch += int(args.num_train % args.batch_size > 0)  # is filled by wrapping
    if args.max_train_batches:
        steps_per_epoch = min(steps_per_epoch, args.max_train_batches)
    return steps_per_epoch


class SyntheticIter:
    """Random images and labels, generated once (seeded); yields ``num_batches`` batches.

    Each batch has ``.data[0]`` (float32, (batch, 3, size, size)), ``.label[0]`` (float32,
    (batch,)) and ``.pad`` 0, like ``mx.io.DataBatch``.
    """

    def __init__(self, batch_size, size, num_classes, num_batches, seed):
        import mxnet as mx
        rng = np.random.RandomState(seed)
        self.batches = []
        for _ in range(min(num_batches, 4)):  # a few distinct batches, cycled
            data = rng.normal(size=(batch_size, 3, size, size)).astype(np.float32)
            label = rng.randint(0, num_classes, size=(batch_size,)).astype(np.float32)
            self.batches.append(mx.io.DataBatch([mx.nd.array(data)], [mx.nd.array(label)], pad=0))
        self.num_batches = num_batches

    def __iter__(self):
        for i in range(self.num_batches):
            yield self.batches[i % len(self.batches)]

    def __len__(self):
        return self.num_batches


def make_rec_iter(args, train, epoch):
    """ImageRecordIter over --rec-train or --rec-val; data order and augmentation depend only on
    (--seed, epoch), so a resumed run sees the same batches as an uninterrupted one."""
    import mxnet as mx
    size = args.input_size
    kw = dict(data_shape=(3, size, size), batch_size=args.batch_size, ctx='cpu',
              preprocess_threads=args.num_workers, round_batch=True, verbose=False,
              mean_r=args.mean_rgb[0], mean_g=args.mean_rgb[1], mean_b=args.mean_rgb[2],
              std_r=args.std_rgb[0], std_g=args.std_rgb[1], std_b=args.std_rgb[2])
    if train:
        kw.update(path_imgrec=args.rec_train, path_imgidx=args.rec_train_idx, shuffle=True,
                  seed=args.seed + epoch, seed_aug=args.seed + epoch,
                  shuffle_chunk_seed=args.seed + epoch, rand_mirror=not args.no_mirror)
        part_index, num_parts = getattr(args, 'part', (0, 1))
        if num_parts > 1:
            kw.update(part_index=part_index, num_parts=num_parts)
        if args.crop_pad:
            kw.update(pad=args.crop_pad, fill_value=0, rand_crop=True)
    else:
        kw.update(path_imgrec=args.rec_val, path_imgidx=args.rec_val_idx, shuffle=False,
                  batch_size=min(args.batch_size, args.num_val))
    return mx.io.ImageRecordIter(**kw)


# ----------------------------------------------------------------------------------------------
# model, mixed precision, trainer
# ----------------------------------------------------------------------------------------------

def build_model(args):
    """GluonCV model, initialised (MSRA init) and run once on a dummy batch of --input-size."""
    import mxnet as mx
    from gluoncv import model_zoo
    names = model_zoo.get_model_list()
    if args.model.lower() not in names:
        close = difflib.get_close_matches(args.model.lower(), names, n=5, cutoff=0.5)
        raise ConfigError('unknown model %r. %sList the %d GluonCV names with `python -c "import '
                          'gluoncv; print(gluoncv.model_zoo.get_model_list())"`.'
                          % (args.model, ('Close names: %s. ' % ', '.join(close)) if close else '',
                             len(names)))
    try:
        # A fresh NameManager: the same parameter names (cifarresnetv10_...) in every run, also
        # when main() runs twice in one process, so checkpoints load by name.
        with mx.name.NameManager():
            net = model_zoo.get_model(args.model, classes=args.num_classes, pretrained=False)
    except TypeError as err:
        raise ConfigError('model %r does not take classes=%d (%s); pick a classifier'
                          % (args.model, args.num_classes, err)) from err
    net.initialize(mx.init.Xavier(rnd_type='gaussian', factor_type='in', magnitude=2))
    try:
        out = net(mx.nd.zeros((1, 3, args.input_size, args.input_size)))
    except mx.base.MXNetError as err:
        raise ConfigError('model %r cannot run on %dx%d inputs (%s); ImageNet models want '
                          '--input-size 224, small-image ones (cifar_*) 28-32'
                          % (args.model, args.input_size, args.input_size,
                             str(err).splitlines()[0])) from err
    if out.shape != (1, args.num_classes):
        raise ConfigError('model %r gives output shape %s, expected (batch, %d): not a classifier'
                          % (args.model, out.shape, args.num_classes))
    return net


def import_mxmp():
    try:
        import mxmp
    except ImportError as err:
        raise ConfigError('--dtype bfloat16/float16 needs mxmp (%s); install it from the repo '
                          'root with `pip install -e .[cpu,examples]`' % err) from err
    return mxmp


def resolve_emulate(args):
    """Decide emulation for a mixed-precision run (auto: on when no real kernels run here)."""
    mxmp = import_mxmp()
    available = mxmp.lp_kernels_available(args.dtype)
    if args.emulate is None:
        if not available:
            LOG.info('no %s kernels on this CPU (mxmp.lp_kernels_available is False): emulating '
                     '%s numerics in float32 kernels (--emulate)', args.dtype, args.dtype)
        return not available
    if not args.emulate and not available:
        raise ConfigError('--no-emulate: %s kernels do not run on this machine '
                          '(mxmp.lp_kernels_available(%r) is False); drop --no-emulate'
                          % (args.dtype, args.dtype))
    return args.emulate


def optimizer_params(args, steps_per_epoch):
    """Optimizer keyword arguments: --lr, --wd, --momentum and the learning-rate schedule.

    The schedule is linear warm-up over --warmup-epochs, then cosine decay to 0 at the last
    update (per update, as gluoncv's LRScheduler), as an ``mx.lr_scheduler.CosineScheduler``.
    """
    import mxnet as mx
    schedule = mx.lr_scheduler.CosineScheduler(
        max_update=steps_per_epoch * args.epochs, base_lr=args.lr, final_lr=0.0,
        warmup_steps=int(round(args.warmup_epochs * steps_per_epoch)))
    return {'learning_rate': args.lr, 'wd': args.wd, 'momentum': args.momentum,
            'lr_scheduler': schedule}


def trainer_status(trainer):
    """(loss scale, skipped steps so far) of a trainer; (1.0, 0) for the float32 gluon.Trainer."""
    return float(getattr(trainer, 'loss_scale', 1.0)), int(getattr(trainer, 'skipped_steps', 0))


# ----------------------------------------------------------------------------------------------
# checkpoints and records
# ----------------------------------------------------------------------------------------------

def peak_rss_mib():
    """Peak resident set size of this process in MiB (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def save_file_atomic(path, save):
    """``save(tmp)`` then fsync and rename over ``path``: ``mxmp.update.save_atomic``."""
    import_mxmp().update.save_atomic(path, save)


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


def truncate_metrics(path, step, epoch):
    """Keep the metrics.jsonl records up to a checkpoint (step, epoch); none for a fresh run.

    A run killed in the middle of an epoch has logged steps past its last checkpoint; a resumed
    run logs them again, so they are dropped first.
    """
    kept = []
    if step and os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:  # a line cut short by the kill
                    continue
                if record.get('step', 0) <= step and record.get('epoch', 0) <= epoch:
                    kept.append(line if line.endswith('\n') else line + '\n')
    with open(path, 'w') as f:
        f.writelines(kept)


class JsonLines:
    """Append-only JSON-lines writer (metrics.jsonl)."""

    def __init__(self, path):
        self.f = open(path, 'a')

    def write(self, **record):
        self.f.write(json.dumps(record) + '\n')

    def close(self):
        self.f.close()


# ----------------------------------------------------------------------------------------------
# training
# ----------------------------------------------------------------------------------------------

def seed_everything(seed):
    import mxnet as mx
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


def evaluate(net, val_iter):
    """Top-1 accuracy over a validation iterator (padding of the last batch excluded)."""
    import mxnet as mx
    correct, total = 0, 0
    if hasattr(val_iter, 'reset'):
        val_iter.reset()
    for batch in val_iter:
        data = batch.data[0].as_in_context(mx.cpu())
        label = batch.label[0].as_in_context(mx.cpu())
        pred = mx.nd.argmax(net(data), axis=1)
        n = data.shape[0] - batch.pad
        hits = (pred[:n] == label[:n].astype(pred.dtype)).sum().asscalar()
        correct += int(hits)
        total += n
    return correct / max(total, 1)


def setup_logging(save_dir):
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        if getattr(h, '_train_imagenet', False):  # from an earlier main() in this process
            root.removeHandler(h)
            h.close()
    fmt = logging.Formatter('%(asctime)s %(levelname)s %(message)s')
    for h in (logging.StreamHandler(), logging.FileHandler(os.path.join(save_dir, 'train.log'))):
        h.setFormatter(fmt)
        h._train_imagenet = True
        root.addHandler(h)


def end_epoch(metrics, epoch, step, losses, images, train_time, loss_scale, skipped_steps,
              val_top1, lr):
    """The record of a finished epoch: built, written to metrics.jsonl, logged, returned.

    Args: the JsonLines writer; epoch number (from 1); global step; the forward losses of its
    steps (inf/NaN ones are left out of the mean); images trained on; training seconds; the
    loss scale and the skipped steps at its end; validation top-1 (None: not validated); lr.
    """
    finite = [x for x in losses if math.isfinite(x)]
    record = {'epoch': epoch, 'train_loss': float(np.mean(finite)) if finite else None,
              'img_per_sec': images / train_time, 'train_time_s': train_time,
              'images': images, 'loss_scale': loss_scale, 'skipped_steps': skipped_steps,
              'val_top1': val_top1, 'lr': lr, 'peak_rss_mib': peak_rss_mib()}
    metrics.write(epoch=epoch, step=step, val_top1=val_top1,
                  train_loss=record['train_loss'], img_per_sec=record['img_per_sec'])
    metrics.f.flush()
    LOG.info('[epoch %d] %.1f img/s, train loss %s, loss scale %g, skipped steps %d, '
             'val top-1 %s, peak RSS %.0f MiB', epoch, record['img_per_sec'],
             '%.4f' % record['train_loss'] if finite else 'n/a', loss_scale, skipped_steps,
             '%.4f' % val_top1 if val_top1 is not None else 'n/a', record['peak_rss_mib'])
    return record


def write_summary(args, history, emulate, step, **extra):
    """Build the run's summary dict, write it to --save-dir/summary.json, log it, return it.

    Keys: args, model, dtype, emulate, cast_params, loss_scale_mode, epochs (the per-epoch
    records), final_val_top1, final_train_loss, img_per_sec (training only, all epochs),
    peak_rss_mib, skipped_steps, loss_scale (at the end), steps, plus ``extra``.
    """
    total_images = sum(r['images'] for r in history)
    total_time = sum(r['train_time_s'] for r in history)
    summary = {
        'args': {k: v for k, v in vars(args).items()},
        'model': args.model, 'dtype': args.dtype, 'emulate': emulate,
        'cast_params': args.cast_params,
        'loss_scale_mode': args.loss_scale if args.dtype != 'float32' else 'none',
        'epochs': history,
        'final_val_top1': history[-1]['val_top1'] if history else None,
        'final_train_loss': history[-1]['train_loss'] if history else None,
        'img_per_sec': total_images / total_time if total_time else None,
        'peak_rss_mib': peak_rss_mib(),
        'skipped_steps': sum(r['skipped_steps'] for r in history),
        'loss_scale': history[-1]['loss_scale'] if history else None,
        'steps': step,
    }
    summary.update(extra)
    with open(os.path.join(args.save_dir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    LOG.info('done: final val top-1 %s, %.1f img/s, peak RSS %.0f MiB; summary in %s',
             summary['final_val_top1'], summary['img_per_sec'] or 0, summary['peak_rss_mib'],
             os.path.join(args.save_dir, 'summary.json'))
    return summary


def main(argv=None):
    """Run training; returns the summary dict (also written to --save-dir/summary.json).

    Raises ConfigError on bad input (missing files, batch larger than the data, unknown model).
    """
    args = parse_args(argv)
    os.makedirs(args.save_dir, exist_ok=True)
    setup_logging(args.save_dir)

    import mxnet as mx
    from mxnet import autograd, gluon
    from tqdm import tqdm

    kv = setup_kvstore(args)
    rank, workers = args.part
    steps_per_epoch = count_data(args)
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
    train_net.hybridize(static_alloc=True, static_shape=True)

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
        val_top1 = evaluate(train_net, val_iter) if val_iter is not None else None
        del val_iter
        scale, skipped_total = trainer_status(trainer)
        history.append(end_epoch(metrics, epoch + 1, step, losses, images, train_time, scale,
                                 skipped_total - skipped_before, val_top1,
                                 float(trainer.learning_rate)))
        save_checkpoint(args.save_dir, epoch + 1, net, trainer, history, step,
                        identity=run_identity(args))
    metrics.close()

    return write_summary(args, history, emulate, step)


def run_cli(main_fn):
    """Run ``main_fn()``; a ConfigError exits with status 2 and one line on stderr."""
    try:
        main_fn()
    except ConfigError as err:
        print('error: %s' % err, file=sys.stderr)
        sys.exit(2)


if __name__ == '__main__':
    run_cli(main)
