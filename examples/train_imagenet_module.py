#!/usr/bin/env python3
"""Train a GluonCV classifier as a Symbolic Module with mxmp.Module.fit, float32 or mixed precision.

The Module counterpart of ``examples/train_imagenet.py``: same flags (``--kvstore`` too), same
data, models, initial weights, data order and augmentation, optimizer and learning-rate schedule.
At equal seed the two scripts differ only in the training API (Gluon + ``mxmp.Trainer`` there,
``Module.fit`` + ``mxmp.Module`` here), so their results can be compared step by step.

* Model: the GluonCV block is built and initialised by ``common.build_model``
  (examples/common.py, shared with train_imagenet.py: same seed, same weights), traced to a
  Symbol (``net(mx.sym.var('data'))``) and given a ``SoftmaxOutput`` head; the block's
  parameters are handed to ``fit`` as ``arg_params``/``aux_params``.
* Training: ``mxmp.Module(symbol, target_dtype=--dtype, loss_scaler=--loss-scale,
  cast_params=--cast-params, emulate=...)`` driven by ``Module.fit`` with
  ``mx.callback.Speedometer``, ``mx.callback.module_checkpoint`` and a validation metric (top-1
  on --rec-val, padding of the last batch excluded). ``--dtype float32`` uses
  ``mxmp.Module(target_dtype='float32')``: no graph pass, no loss scaling, but mxmp's optimizer
  state file (MXNet 1.9.1's ``Module.save_optimizer_states`` drops the optimizer's update counts,
  so a resumed run would restart the learning-rate schedule).
* Optimizer: an ``mx.optimizer.Optimizer`` built without the symbol, so weight decay applies to
  every parameter as in Gluon (MXNet's Module otherwise zeroes it for names not ending in
  ``_weight``/``_gamma``: ``Optimizer.set_wd_mult``).
* Data: ``mx.io.ImageRecordIter`` exactly as train_imagenet.py configures it, one fresh iterator
  per epoch seeded with ``--seed + epoch`` (:class:`EpochIter`), so both scripts see the same
  batches; ``--synthetic`` random batches for tests.

Outputs in ``--save-dir``: ``train.log``; ``metrics.jsonl`` and ``summary.json`` with the keys of
train_imagenet.py (plus ``driver``, ``kvstore``); ``model-symbol.json`` and ``model-NNNN.params``
/ ``.states`` / ``.mxmp.json`` after every epoch (``mx.mod.Module.load('model', N)`` reads them),
and ``checkpoint.json`` naming the last complete epoch (``--resume`` continues from it).

Example (Fashion-MNIST, see examples/README.md)::

    python examples/train_imagenet_module.py --dtype bfloat16 --epochs 1 --save-dir runs/mod-bf16
"""
import json
import logging
import math
import os
import sys
import time

import mxnet as mx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (shared with train_imagenet.py: flags, data, model, records)
from common import ConfigError  # noqa: E402,F401  (re-exported for callers and tests)

LOG = logging.getLogger('train_imagenet_module')
CHECKPOINT_PREFIX = 'model'
DATA_NAME, LABEL_NAME = 'data', 'softmax_label'


def parse_args(argv=None):
    """train_imagenet.py's command line (``--kvstore`` included); ConfigError on bad values."""
    parser = common.build_parser()
    parser.description = ('Train a GluonCV classifier as a Symbolic Module (mxmp.Module.fit) in '
                          'float32 or mixed precision.')
    parser.set_defaults(save_dir='runs/train_imagenet_module')
    return common.parse_args(argv, parser)


class EpochIter(mx.io.DataIter):
    """A ``DataIter`` for ``Module.fit``/``score`` that makes a fresh inner iterator per pass.

    ``make(epoch)`` returns an iterable of ``mx.io.DataBatch`` (``ImageRecordIter`` or
    ``SyntheticIter``); it is called at the first ``next()`` after construction or ``reset()``,
    so an iterator exists only while it is read (an idle ``ImageRecordIter`` keeps decoding and
    slows training) and each epoch gets its own seed, as in train_imagenet.py. ``reset()``
    (which ``fit`` calls after every epoch) moves to the next epoch.

    Args:
        make (callable): ``epoch -> iterable of DataBatch``.
        batch_size (int), data_shape (tuple): shapes of ``provide_data``/``provide_label``.
        num_batches (int or None): stop after this many batches per pass (--max-train-batches).
        first_epoch (int): epoch number of the first pass (``begin_epoch`` of a resumed run).
        mark_padding (bool): set the labels of the padding records of a last, wrapped-around
            batch (``batch.pad``) to -1, which :func:`top1_metric` ignores (``Module.score``
            passes no padding information to metrics).
    """

    def __init__(self, make, batch_size, data_shape, num_batches=None, first_epoch=0,
                 mark_padding=False):
        super().__init__(batch_size)
        self.provide_data = [mx.io.DataDesc(DATA_NAME, (batch_size,) + tuple(data_shape))]
        self.provide_label = [mx.io.DataDesc(LABEL_NAME, (batch_size,))]
        self._make, self._num_batches = make, num_batches
        self._mark_padding = mark_padding
        self.epoch = first_epoch
        self._inner, self._count, self._done = None, 0, False

    def reset(self):
        """Drop the current inner iterator; the next pass is the next epoch."""
        if self._inner is not None or self._done:
            self.epoch += 1
        self._inner, self._count, self._done = None, 0, False

    def __next__(self):
        if self._done or (self._num_batches is not None and self._count >= self._num_batches):
            self._inner, self._done = None, True
            raise StopIteration
        if self._inner is None:
            self._inner = iter(self._make(self.epoch))
        try:
            batch = next(self._inner)
        except StopIteration:
            self._inner, self._done = None, True
            raise
        self._count += 1
        if self._mark_padding and batch.pad:
            label = batch.label[0].copy()
            label[label.shape[0] - batch.pad:] = -1
            batch = mx.io.DataBatch(batch.data, [label], pad=batch.pad)
        return batch

    def next(self):
        """The next DataBatch (StopIteration at the end of the pass)."""
        return self.__next__()


def _top1_ignoring_padding(label, pred):
    keep = label >= 0
    return int((pred.argmax(axis=1)[keep] == label[keep]).sum()), int(keep.sum())


def top1_metric():
    """Validation metric ``top1``: top-1 accuracy over the records whose label is >= 0."""
    return mx.metric.CustomMetric(_top1_ignoring_padding, name='top1')


def build_symbol_and_params(args):
    """The GluonCV block of train_imagenet.py as ``(symbol, arg_params, aux_params)``.

    The block is built and initialised by ``common.build_model`` (so the current random state
    decides the weights, as in the Gluon script), traced on ``mx.sym.var('data')``, and
    topped with ``SoftmaxOutput`` (label ``softmax_label``). The params are copies of the
    block's, keyed by the block's parameter names (which are the symbol's argument names).
    """
    net = common.build_model(args)
    symbol = mx.sym.SoftmaxOutput(net(mx.sym.var(DATA_NAME)), name='softmax')
    params = net.collect_params()
    args_needed = set(symbol.list_arguments()) - {DATA_NAME, LABEL_NAME}
    aux_needed = set(symbol.list_auxiliary_states())
    arg_params = {n: p.data().copy() for n, p in params.items() if n in args_needed}
    aux_params = {n: p.data().copy() for n, p in params.items() if n in aux_needed}
    missing = (args_needed - set(arg_params)) | (aux_needed - set(aux_params))
    if missing:
        raise ConfigError('model %r: the traced symbol has inputs that are not parameters of the '
                          'block (%s); this script needs a block whose only input is the image'
                          % (args.model, ', '.join(sorted(missing))))
    return symbol, arg_params, aux_params


class StepLoss(mx.metric.EvalMetric):
    """Training metric ``cross-entropy`` of the SoftmaxOutput probabilities, per image.

    Besides the running mean (which the Speedometer logs) it keeps each step's sum and count
    until :meth:`take`: ``fit`` updates the metric before it fetches the next batch, whereas a
    ``batch_end_callback`` runs after, when an ``ImageRecordIter`` has already overwritten the
    current batch's labels with the next ones.
    """

    def __init__(self):
        super().__init__('cross-entropy')
        self._pending = []

    def update(self, labels, preds):
        """Add the per-image losses ``-log(max(p[label], 1e-12))`` of a batch (per context)."""
        for label, prob in zip(labels, preds):
            picked = mx.nd.pick(prob, label.as_in_context(prob.context), axis=1)
            total = float((-mx.nd.log(mx.nd.maximum(picked, 1e-12))).sum().asscalar())
            count = label.shape[0]
            self._pending.append((total, count))
            self.sum_metric += total
            self.global_sum_metric += total
            self.num_inst += count
            self.global_num_inst += count

    def take(self):
        """Mean loss per image of the updates since the last call (one training step)."""
        total = sum(t for t, _ in self._pending)
        count = sum(c for _, c in self._pending)
        self._pending = []
        return total / count if count else float('nan')


class Recorder:
    """The callbacks that log steps and epochs and write checkpoint.json (fit's bookkeeping).

    ``batch_end`` (a ``batch_end_callback``) writes a metrics.jsonl line per step: the forward
    loss (from :class:`StepLoss`), the loss scale that step's backward used, whether the update
    was skipped on overflow, the learning rate. ``epoch_end`` (an ``epoch_end_callback``, after
    ``module_checkpoint``) closes the training time of the epoch; ``val_end``
    (``eval_end_callback``) adds the validation top-1, logs the epoch and points checkpoint.json
    at the epoch's files. Without validation ``epoch_end`` does that.
    """

    def __init__(self, mod, args, metrics, step, history, steps_per_epoch, validate):
        self.mod, self.args, self.metrics = mod, args, metrics
        self.step, self.history = step, history
        self.steps_per_epoch, self.validate = steps_per_epoch, validate
        self.step_loss = StepLoss()
        self.scale = mod.loss_scale       # the scale the next backward uses
        self.skipped_seen = mod.skipped_steps
        self.tic, self.losses, self.images, self.skipped_before = None, [], 0, 0
        self.pending = None

    def start_epoch(self):
        """Called when an epoch's training iterator exists: the clock starts."""
        self.tic = time.time()
        self.losses, self.images = [], 0
        self.skipped_before = self.mod.skipped_steps

    def learning_rate(self):
        # MXNet's Module has no public accessor for its optimizer; mxmp replaces it on resume
        return float(self.mod._optimizer.learning_rate)  # pylint: disable=protected-access

    def batch_end(self, param):
        """batch_end_callback: one metrics.jsonl line per step (and a log line every N)."""
        batch = param.locals['data_batch']
        loss = self.step_loss.take()
        skipped = self.mod.skipped_steps > self.skipped_seen
        self.skipped_seen = self.mod.skipped_steps
        self.step += 1
        self.images += batch.data[0].shape[0]
        self.losses.append(loss)
        lr = self.learning_rate()
        self.metrics.write(step=self.step, epoch=param.epoch + 1,
                           loss=loss if math.isfinite(loss) else None, loss_scale=self.scale,
                           skipped=skipped, lr=lr)
        if self.args.log_interval and (param.nbatch + 1) % self.args.log_interval == 0:
            LOG.info('epoch %d batch %d/%d loss %.4f lr %.4g loss scale %g skipped steps %d',
                     param.epoch + 1, param.nbatch + 1, self.steps_per_epoch, loss, lr,
                     self.scale, self.mod.skipped_steps)
        self.scale = self.mod.loss_scale

    def epoch_end(self, epoch, symbol=None, arg_params=None, aux_params=None):  # noqa: ARG002
        """epoch_end_callback: stop the epoch's clock (the checkpoint files are written)."""
        mx.nd.waitall()
        self.pending = (epoch + 1, time.time() - self.tic)
        if not self.validate:
            self._finish(None)

    def val_end(self, param):
        """eval_end_callback: the validation top-1 closes the epoch's record."""
        self._finish(dict(param.eval_metric.get_name_value())['top1'])

    def _finish(self, val_top1):
        epoch, train_time = self.pending
        self.history.append(common.end_epoch(
            self.metrics, epoch, self.step, self.losses, self.images, train_time,
            self.mod.loss_scale, self.mod.skipped_steps - self.skipped_before, val_top1,
            self.learning_rate()))
        index = {'epoch': epoch, 'step': self.step, 'prefix': CHECKPOINT_PREFIX,
                 'history': self.history}
        tmp = os.path.join(self.args.save_dir, common.CHECKPOINT_INDEX + '.tmp')
        with open(tmp, 'w') as f:
            json.dump(index, f, indent=1)
        os.replace(tmp, os.path.join(self.args.save_dir, common.CHECKPOINT_INDEX))


def make_module(args, emulate, symbol):
    """A fresh mxmp.Module for the flags (float32: target_dtype 'float32', no scaling)."""
    mxmp = common.import_mxmp()
    mixed = args.dtype != 'float32'
    return mxmp.Module(symbol, (DATA_NAME,), (LABEL_NAME,), target_dtype=args.dtype,
                       loss_scaler=args.loss_scale if mixed else 'none',
                       cast_params=args.cast_params, emulate=emulate, context=mx.cpu(),
                       logger=logging)


def load_module(args, emulate):
    """The mxmp.Module of the last checkpoint in --save-dir, and its checkpoint.json index."""
    mxmp = common.import_mxmp()
    path = os.path.join(args.save_dir, common.CHECKPOINT_INDEX)
    if not os.path.isfile(path):
        raise ConfigError('--resume: no checkpoint in %s (%s missing); run without --resume first'
                          % (args.save_dir, common.CHECKPOINT_INDEX))
    with open(path) as f:
        index = json.load(f)
    prefix = os.path.join(args.save_dir, index['prefix'])
    mixed = args.dtype != 'float32'
    try:
        mod = mxmp.Module.load(prefix, index['epoch'], load_optimizer_states=True,
                               data_names=(DATA_NAME,), label_names=(LABEL_NAME,),
                               target_dtype=args.dtype,
                               loss_scaler=args.loss_scale if mixed else 'none',
                               cast_params=args.cast_params, emulate=emulate, context=mx.cpu(),
                               logger=logging)
    except ValueError as err:
        raise ConfigError('--resume: the checkpoint %s-%04d does not match these flags (%s); '
                          'resume with the flags of the first run' % (prefix, index['epoch'], err)
                          ) from err
    return mod, index


def main(argv=None):
    """Run training with Module.fit; returns the summary dict (also in --save-dir/summary.json).

    Raises ConfigError on bad input (missing files, batch larger than the data, unknown model,
    a --resume without checkpoint or with other flags).
    """
    args = parse_args(argv)
    os.makedirs(args.save_dir, exist_ok=True)
    common.setup_logging(args.save_dir)

    kvstore = common.setup_kvstore(args)   # dist_*: this worker's part of the data
    steps_per_epoch = common.count_data(args)
    common.seed_everything(args.seed)
    emulate = common.resolve_emulate(args) if args.dtype != 'float32' else False
    symbol, arg_params, aux_params = build_symbol_and_params(args)  # the Gluon script's weights

    start_epoch, step, history = 0, 0, []
    if args.resume:
        mod, index = load_module(args, emulate)
        start_epoch, step, history = index['epoch'], index['step'], index['history']
        arg_params = aux_params = None  # fit keeps the loaded ones
        LOG.info('resumed from %s: %d epoch(s) done, step %d', args.save_dir, start_epoch, step)
    else:
        mod = make_module(args, emulate, symbol)
    common.truncate_metrics(os.path.join(args.save_dir, 'metrics.jsonl'), step, start_epoch)
    metrics = common.JsonLines(os.path.join(args.save_dir, 'metrics.jsonl'))
    if metrics.f.tell() == 0:   # a fresh file: say what runs (mxmp plot titles the figure)
        metrics.write(model=args.model, dtype=args.dtype, emulate=bool(emulate),
                      cast_params=bool(getattr(args, 'cast_params', False)),
                      loss_scale_mode=args.loss_scale if args.dtype != 'float32' else 'none')
    validate = bool(args.synthetic or args.rec_val)
    recorder = Recorder(mod, args, metrics, step, history, steps_per_epoch, validate)

    size = args.input_size

    def make_train(epoch):
        common.seed_everything(args.seed + epoch)
        if args.synthetic:
            it = common.SyntheticIter(args.batch_size, size, args.num_classes, steps_per_epoch,
                                  args.seed + epoch)
        else:
            it = common.make_rec_iter(args, train=True, epoch=epoch)
        recorder.start_epoch()
        return it

    def make_val(epoch):
        if args.synthetic:
            return common.SyntheticIter(args.batch_size, size, args.num_classes, 2,
                                        args.seed + 10**6)
        return common.make_rec_iter(args, train=False, epoch=epoch)

    train_iter = EpochIter(make_train, args.batch_size, (3, size, size), steps_per_epoch,
                           first_epoch=start_epoch)
    val_iter = None
    if validate:
        val_batch = args.batch_size if args.synthetic else min(args.batch_size, args.num_val)
        val_iter = EpochIter(make_val, val_batch, (3, size, size), mark_padding=True)

    # Built without the symbol: weight decay on every parameter, as gluon.Trainer does.
    optimizer = mx.optimizer.create(args.optimizer, rescale_grad=1.0 / args.batch_size,
                                    **common.optimizer_params(args, steps_per_epoch))
    LOG.info('mxmp.Module.fit: model %s, dtype %s%s%s, loss scaler %s, kvstore %s, batch %d, '
             '%d steps/epoch x %d epochs, %d train / %d val images%s', args.model, args.dtype,
             ' (emulated)' if emulate else '', ' cast-params' if args.cast_params else '',
             type(mod.loss_scaler).__name__, args.kvstore, args.batch_size, steps_per_epoch,
             args.epochs, args.num_train, args.num_val, ' (synthetic)' if args.synthetic else '')
    prefix = os.path.join(args.save_dir, CHECKPOINT_PREFIX)
    # --log-interval 0: one Speedometer line per epoch, at its last batch (nbatch counts from 0)
    speedometer = mx.callback.Speedometer(
        args.batch_size, frequent=args.log_interval or max(1, steps_per_epoch - 1))
    try:
        train_metric = mx.metric.CompositeEvalMetric([mx.metric.Accuracy(), recorder.step_loss])
        mod.fit(train_iter, eval_data=val_iter, eval_metric=train_metric,
                validation_metric=top1_metric(), kvstore=kvstore, optimizer=optimizer,
                arg_params=arg_params, aux_params=aux_params,
                begin_epoch=start_epoch, num_epoch=args.epochs,
                batch_end_callback=[recorder.batch_end, speedometer],
                epoch_end_callback=[mx.callback.module_checkpoint(mod, prefix,
                                                                  save_optimizer_states=True),
                                    recorder.epoch_end],
                eval_end_callback=recorder.val_end)
    finally:
        metrics.close()
    return common.write_summary(args, history, emulate, recorder.step, driver='mxmp.Module.fit',
                            kvstore=args.kvstore, checkpoint_prefix=prefix)


if __name__ == '__main__':
    common.run_cli(main)
