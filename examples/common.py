"""What examples/train_imagenet.py (Gluon) and examples/train_imagenet_module.py (Module) share.

* Flags: :func:`build_parser` (GluonCV's ``train_imagenet.py`` names) and :func:`parse_args`,
  which raises :class:`ConfigError` (bad command-line input or data, naming the fix).
* Data: :func:`count_records`, :func:`count_data`, :func:`setup_kvstore` (``--kvstore dist_*``:
  this worker's part), :class:`SyntheticIter`, :func:`make_rec_iter` (``mx.io.ImageRecordIter``
  seeded by ``--seed`` and the epoch, so both scripts see the same batches).
* Model and precision: :func:`build_model` (GluonCV, initialised), :func:`import_mxmp`,
  :func:`resolve_emulate`, :func:`optimizer_params` (learning-rate schedule).
* Records: :func:`seed_everything`, :func:`setup_logging`, :class:`JsonLines`,
  :func:`truncate_metrics` (on ``--resume``), :func:`end_epoch`, :func:`write_summary`,
  ``CHECKPOINT_INDEX``, :func:`run_cli` (a ConfigError exits 2 with one line).

Not a script: the two training scripts put this directory on ``sys.path`` and ``import common``.
"""
import argparse
import difflib
import json
import logging
import math
import os
import random
import resource
import sys

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


def close_kvstore(kv):
    """Free a dist kvstore (an ``mx.kv.KVStore``) now, at the end of a run; a name: nothing.

    ps-lite finalizes (a barrier of every node, its network threads stopped) when MXNet's
    kvstore object is freed. Gluon's Parameters keep their Trainer and so the kvstore alive
    until the interpreter exits, and there ps-lite's ZMQVan was destroyed with its threads
    still running: ``std::terminate`` after the run's last line, exit code 134, in about half
    of the two-worker runs on a loaded 2-core machine (MXNet 1.9.1). The handle is freed
    through MXNet's C API (``MXKVStoreFree``) and replaced by NULL, which the object's own
    ``__del__`` later frees as a no-op.
    """
    if isinstance(kv, str) or kv is None:
        return
    import ctypes
    import mxnet as mx
    from mxnet.base import _LIB, check_call
    mx.nd.waitall()
    check_call(_LIB.MXKVStoreFree(kv.handle))
    kv.handle = ctypes.c_void_p()


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

def small_cnn(classes, width=16):
    """A small VGG-style CNN for 28x28 images, defined here (not in GluonCV's model zoo).

    Layers: two 3x3 convolutions of ``width`` channels, 2x2 max pooling, two of ``2 * width``,
    max pooling, global average pooling, a dense layer of ``classes`` outputs; BatchNorm and ReLU
    after every convolution. With ``width=16`` it has 17,082 trainable parameters and 4.9M
    multiply-adds per 28x28 image, so a Fashion-MNIST epoch (60,000 images) costs about 20 s on
    two cores: the model of ``python -m benchmarks.accuracy``, which trains it to convergence
    many times.

    Parameters
    ----------
    classes : int
        Number of outputs (logits, float32).
    width : int
        Channels of the first two convolutions (default 16).

    Returns
    -------
    mxnet.gluon.nn.HybridSequential, uninitialised; input (batch, 3, H, W) float32 with H, W
    divisible by 4, output (batch, classes).
    """
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    with net.name_scope():
        for channels in (width, width, None, 2 * width, 2 * width, None):
            if channels is None:
                net.add(nn.MaxPool2D(pool_size=2, strides=2))
                continue
            net.add(nn.Conv2D(channels, kernel_size=3, padding=1, use_bias=False),
                    nn.BatchNorm(), nn.Activation('relu'))
        net.add(nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(classes))
    return net


def small_mobilenet(classes, width=16):
    """A small MobileNet (v1-style depthwise-separable blocks) for 28x28 images, defined here.

    A 3x3 convolution of ``width`` channels, then five blocks of a 3x3 depthwise convolution
    (one group per channel; stride 2 in the 2nd and 4th) and a 1x1 pointwise convolution to
    2, 4, 4, 8 and 8 times ``width`` channels, BatchNorm and ReLU after every convolution,
    global average pooling and a dense layer. Its depthwise convolutions (few multiply-adds per
    value, long chains of them) are the numerics a plain CNN does not have: the second model
    of ``python -m benchmarks.accuracy``.

    Parameters
    ----------
    classes : int
        Number of outputs (logits, float32).
    width : int
        Channels of the first convolution (default 16).

    Returns
    -------
    mxnet.gluon.nn.HybridSequential, uninitialised; input (batch, 3, H, W) float32 with H, W
    divisible by 4, output (batch, classes).
    """
    from mxnet.gluon import nn

    def conv_bn_relu(net, channels, kernel, stride=1, groups=1):
        net.add(nn.Conv2D(channels, kernel_size=kernel, strides=stride, padding=kernel // 2,
                          groups=groups, use_bias=False),
                nn.BatchNorm(), nn.Activation('relu'))

    net = nn.HybridSequential()
    with net.name_scope():
        conv_bn_relu(net, width, 3)
        channels = width
        for out, stride in ((2, 1), (4, 2), (4, 1), (8, 2), (8, 1)):
            conv_bn_relu(net, channels, 3, stride=stride, groups=channels)   # depthwise
            conv_bn_relu(net, out * width, 1)                                # pointwise
            channels = out * width
        net.add(nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(classes))
    return net


def cifar_wideresnet16_4(classes):
    """GluonCV's CIFAR wide ResNet at depth 16 and width factor 4 (WRN-16-4), which its model
    zoo does not register by name (it has 16-10, 28-10 and 40-8).

    Stages of 64, 128 and 256 channels (2.7M parameters): wide enough for bfloat16 kernels to
    pay in training, narrow enough to train a few hundred steps in minutes on 2 cores (the
    model of ``scripts/quickstart.sh``).

    Parameters
    ----------
    classes : int
        Number of outputs.

    Returns
    -------
    mxnet.gluon.HybridBlock, uninitialised; input (batch, 3, H, W) float32, output
    (batch, classes).
    """
    from gluoncv.model_zoo.cifarwideresnet import get_cifar_wide_resnet
    return get_cifar_wide_resnet(16, 4, classes=classes)


# Models defined in this file, beside GluonCV's: name -> builder(classes).
LOCAL_MODELS = {'small_cnn': small_cnn, 'small_mobilenet': small_mobilenet,
                'cifar_wideresnet16_4': cifar_wideresnet16_4}


def build_model(args):
    """GluonCV model (or one of :data:`LOCAL_MODELS`), initialised (MSRA init) and run once on a
    dummy batch of --input-size."""
    import mxnet as mx
    from gluoncv import model_zoo
    names = list(model_zoo.get_model_list()) + sorted(LOCAL_MODELS)
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
            if args.model.lower() in LOCAL_MODELS:
                net = LOCAL_MODELS[args.model.lower()](args.num_classes)
            else:
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


# ----------------------------------------------------------------------------------------------
# records
# ----------------------------------------------------------------------------------------------

def peak_rss_mib():
    """Peak resident set size of this process in MiB (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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

def seed_everything(seed):
    import mxnet as mx
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)


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


def run_cli(main_fn):
    """Run ``main_fn()``; a ConfigError exits with status 2 and one line on stderr."""
    try:
        main_fn()
    except ConfigError as err:
        print('error: %s' % err, file=sys.stderr)
        sys.exit(2)
