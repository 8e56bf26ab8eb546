#!/usr/bin/env python3
"""Worker of tests/distributed/test_kvstore.py: a tiny MLP in emulated bfloat16, mxmp.Trainer or Module.

Run it under ``scripts/launch_local.py`` with ``--kvstore dist_sync`` (each worker trains on its
shard of a global batch) or alone with ``--kvstore none`` (one process on the whole global
batch: the reference). The model, data and injected overflow are functions of the arguments
only, so both runs see the same numbers:

* model: ``mlp_fc1`` Dense(16, relu) -> ``mlp_fc2`` Dense(4), converted with
  ``mxmp.convert(net, 'bfloat16', emulate=True, cast_params=...)`` (``--dtype float32``: not
  converted), initial values from ``--init`` (a ``save_parameters`` file written by the test);
* data: step ``k`` uses a global batch of ``num_workers * batch`` rows drawn from
  ``RandomState(seed + k)``; the worker of rank ``r`` takes rows ``[r*batch, (r+1)*batch)``
  (``kv.rank``: the scheduler's rank, not the launcher's index);
* loss: softmax cross-entropy summed over the batch, dynamic loss scaling, and
  ``trainer.step(batch * num_workers)``: dist_sync *sums* the workers' gradients, so dividing
  by the global batch makes N workers on ``batch`` rows each take the same step as one process
  on the ``N * batch`` rows;
* overflow: at step ``--inf-step`` the loss of the rows of rank ``--inf-rank`` is multiplied by
  inf (only that worker's loss in a distributed run);
* ``--perturb-other-ranks``: every worker but rank 0 doubles its initial values, so the run
  matches the reference only if every worker starts from rank 0's values (the initial
  broadcast of ``mxmp.Trainer`` / ``mxmp.Module.init_optimizer``);
* ``--kvstore horovod`` (under ``horovodrun``): ``hvd.init()`` and
  ``mxmp.horovod.DistributedTrainer`` instead of a kvstore, ``trainer.step(batch)`` (it
  averages over the workers itself); gluon only;
* ``--api module``: the same MLP as a Symbol with SoftmaxOutput, trained by ``mxmp.Module``
  (parameters ``fc1_weight``, ...; MXNet's Module divides by ``batch * num_workers`` for
  dist_sync by itself); the overflow sets the marked rows of the data to inf.

Output: ``OUT/rank<r>.npz`` with, per step ``k``, the float32 parameters after the step
(``k<step>/<name>``: the master weights for bfloat16 Parameters), and the arrays
``loss_scale``, ``skipped_steps``, ``applied``, ``loss_sum``, ``rounded_masters`` (one entry
per step, see :func:`train`) plus ``num_workers``, ``bytes_pushed``
(``Trainer.bytes_pushed_per_step``), ``exchange_dtypes`` and ``param_dtypes`` (per Parameter,
sorted by name).
"""
import argparse
import logging
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon, nd  # noqa: E402

import mxmp  # noqa: E402

IN_UNITS, HIDDEN, CLASSES = 10, 16, 4


def make_net():
    """The float32 MLP with deterministic Parameter names (``mlp_fc1_weight``, ...)."""
    net = gluon.nn.HybridSequential(prefix='mlp_')
    with net.name_scope():
        net.add(gluon.nn.Dense(HIDDEN, in_units=IN_UNITS, activation='relu', prefix='fc1_'),
                gluon.nn.Dense(CLASSES, in_units=HIDDEN, prefix='fc2_'))
    return net


def write_init(path, seed=0):
    """Write initial float32 parameters of :func:`make_net` to ``path`` (Xavier, ``seed``)."""
    mx.random.seed(seed)
    net = make_net()
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.save_parameters(path)


def global_batch(step, rows, seed):
    """The global batch of ``step``: (data float32 (rows, IN_UNITS), labels float32 (rows,))."""
    rng = np.random.RandomState(seed + step)
    x = rng.normal(size=(rows, IN_UNITS)).astype(np.float32)
    y = rng.randint(0, CLASSES, size=rows).astype(np.float32)
    return x, y


def is_low_precision(dtype):
    """bool: float16, or contrib.amp's bfloat16 (a numpy structured dtype named 'bfloat16')."""
    npd = np.dtype(dtype)
    return npd.names == ('bfloat16',) or npd == np.float16


def params_float32(trainer, net):
    """name -> float32 numpy array of every Parameter (master weights where they exist)."""
    out = {}
    for name, param in net.collect_params().items():
        if is_low_precision(param.dtype):
            out[name] = trainer.master_weights(param)[0].asnumpy()
        else:
            out[name] = param.data().asnumpy()
    return out


def train(init, steps, batch, kvstore='none', num_shards=None, seed=1, inf_step=-1,
          inf_rank=1, cast_params=False, init_scale=2.0 ** 10, lr=0.1, dtype='bfloat16',
          api='gluon', grad_dtype=None, perturb_other_ranks=False, hvd_prefix='mxmp.'):
    """Train and return the per-step records (see the module docstring).

    Args:
        init (str): parameters file of :func:`make_net` (``save_parameters`` format).
        steps (int): number of steps.
        batch (int): rows per worker per step.
        kvstore (str): ``'none'`` (one process on the whole global batch), a kvstore type, or
            ``'horovod'`` (under horovodrun, :class:`mxmp.horovod.DistributedTrainer`).
        num_shards (int or None): how many workers the global batch is made for; default the
            kvstore's ``num_workers`` (1 without a dist kvstore).
        seed (int): data seed.
        inf_step (int): step at which rank ``inf_rank``'s loss is multiplied by inf (-1: never).
        inf_rank (int): whose rows overflow.
        cast_params (bool): store the converted net's weights in bfloat16 (master weights).
        init_scale (float): first loss scale of the dynamic scaler.
        lr (float): SGD learning rate (momentum 0.9).
        dtype (str): ``'bfloat16'`` (convert the net, emulated) or ``'float32'`` (no convert).
        api (str): ``'gluon'`` (mxmp.convert + mxmp.Trainer) or ``'module'`` (mxmp.Module).
        grad_dtype (str or None): ``mxmp.Trainer(grad_dtype=...)`` (gluon only).
        perturb_other_ranks (bool): ranks other than 0 start from twice the initial values.
        hvd_prefix (str): ``prefix`` of the Horovod trainer's tensor names (one per run when a
            process trains several times).

    Returns:
        dict: ``params`` (list per step of name -> float32 array), ``loss_scale``,
        ``skipped_steps``, ``applied``, ``loss_sum`` (this process's loss summed over its rows,
        before the overflow's inf; NaN for the Module), ``rounded_masters`` (every
        low-precision Parameter equals its master weight rounded to its dtype; True when there
        is none) (lists per step), ``param_dtypes`` (sorted by name), ``rank``,
        ``num_workers``.
    """
    if kvstore == 'horovod' and api != 'gluon':
        raise ValueError("--kvstore horovod needs --api gluon (mxmp.horovod has no Module)")
    if kvstore == 'horovod':   # under horovodrun; imported only here
        import horovod.mxnet as hvd
        hvd.init()
        kv, rank, num_workers = 'horovod', hvd.rank(), hvd.size()
    else:
        kv = None if kvstore == 'none' else mx.kv.create(kvstore)
        rank = kv.rank if kv is not None else 0
        num_workers = kv.num_workers if kv is not None else 1
    shards = num_shards or num_workers
    scaler = mxmp.DynamicLossScaler(init_scale=init_scale, growth_interval=1000)
    factor = 2.0 if perturb_other_ranks and rank > 0 else 1.0
    if api == 'gluon':
        step_fn, read_params, status, exchange, net = _gluon_trainer(
            init, kv, batch, shards, scaler, cast_params, lr, dtype, grad_dtype, factor,
            hvd_prefix)
    else:
        step_fn, read_params, status = _module_trainer(init, kv, batch, shards, scaler,
                                                       cast_params, lr, dtype, factor)
        exchange = lambda: (0, [])  # noqa: E731
        net = None
    # Rows of this process: its shard in a distributed run, everything otherwise.
    lo, hi = (rank * batch, (rank + 1) * batch) if num_workers > 1 else (0, shards * batch)
    records = {'params': [], 'loss_scale': [], 'skipped_steps': [], 'applied': [],
               'loss_sum': [], 'rounded_masters': [], 'rank': rank, 'num_workers': num_workers,
               'param_dtypes': [] if net is None else
               [dtype_label(p.dtype) for _, p in sorted(net.collect_params().items())]}
    for step in range(steps):
        x, y = global_batch(step, shards * batch, seed)
        mult = np.ones(shards * batch, np.float32)
        if step == inf_step:
            mult[inf_rank * batch:(inf_rank + 1) * batch] = np.inf
        applied, loss_sum = step_fn(x[lo:hi], y[lo:hi], mult[lo:hi])
        scale, skipped = status()
        records['loss_sum'].append(loss_sum)
        records['rounded_masters'].append(True if net is None else rounded_masters(net))
        records['params'].append(read_params())
        records['loss_scale'].append(scale)
        records['skipped_steps'].append(skipped)
        records['applied'].append(bool(applied))
        logging.info('rank %d step %d: applied %s, loss scale %g, skipped %d', rank, step,
                     applied, scale, skipped)
    records['bytes_pushed'], records['exchange_dtypes'] = exchange()
    return records


def dtype_label(dtype):
    """str: ``'bfloat16'`` for contrib.amp's bfloat16, else numpy's name."""
    return 'bfloat16' if np.dtype(dtype).names == ('bfloat16',) else np.dtype(dtype).name


def rounded_masters(net):
    """bool: every low-precision Parameter holds its live master weight rounded to its dtype
    (``mxmp.convert``'s parameter file reads the master, ``Parameter.data()`` the weight)."""
    from mxmp._src.training.master_weights import master_value
    for param in net.collect_params().values():
        if not is_low_precision(param.dtype):
            continue
        master = master_value(param)
        if master is None:
            return False
        rounded = nd.amp_cast(nd.amp_cast(master, dtype=param.dtype), dtype='float32')
        if not np.array_equal(rounded.asnumpy(),
                              nd.amp_cast(param.data(), dtype='float32').asnumpy()):
            return False
    return True


def _gluon_trainer(init, kv, batch, shards, scaler, cast_params, lr, dtype, grad_dtype,
                   factor=1.0, hvd_prefix='mxmp.'):
    """mxmp.convert + mxmp.Trainer; the overflow multiplies the loss of the marked rows."""
    net = make_net()
    net.load_parameters(init)
    for param in net.collect_params().values():
        param.set_data(param.data() * factor)
    if dtype == 'bfloat16':
        net = mxmp.convert(net, 'bfloat16', emulate=True, cast_params=cast_params)
    extra = {} if grad_dtype is None else {'grad_dtype': grad_dtype}
    opt = {'learning_rate': lr, 'momentum': 0.9}
    if kv == 'horovod':
        from mxmp.horovod import DistributedTrainer
        trainer = DistributedTrainer(net.collect_params(), 'sgd', opt, loss_scaler=scaler,
                                     prefix=hvd_prefix, **extra)
    else:
        trainer = mxmp.Trainer(net.collect_params(), 'sgd', opt, kvstore=kv, loss_scaler=scaler,
                               **extra)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step_fn(x, y, mult):
        x, y, mult = nd.array(x), nd.array(y), nd.array(mult)
        with autograd.record():
            plain = loss_fn(net(x), y)
            loss = plain * mult
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        # dist_sync sums the workers' gradients: divide by the global batch. Horovod's trainer
        # (like hvd.DistributedTrainer) takes one worker's batch and divides by the workers.
        applied = trainer.step(batch if kv == 'horovod' else batch * shards)
        return applied, float(plain.sum().asscalar())

    def exchange():
        if not hasattr(trainer, 'bytes_pushed_per_step'):   # mxmp without grad_dtype
            return 0, []
        names = sorted(net.collect_params().keys())
        return trainer.bytes_pushed_per_step(), [trainer.exchange_dtype(n) for n in names]

    return (step_fn, lambda: params_float32(trainer, net),
            lambda: (trainer.loss_scale, trainer.skipped_steps), exchange, net)


def module_symbol():
    """The same MLP as a Symbol with a SoftmaxOutput head (names fc1_*, fc2_*)."""
    data = mx.sym.var('data')
    hidden = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=HIDDEN, name='fc1'),
                               act_type='relu')
    out = mx.sym.FullyConnected(hidden, num_hidden=CLASSES, name='fc2')
    return mx.sym.SoftmaxOutput(out, name='softmax')


def _module_trainer(init, kv, batch, shards, scaler, cast_params, lr, dtype, factor=1.0):
    """mxmp.Module; the overflow sets the marked rows of the data to inf."""
    rows = batch * shards if kv is None else batch
    loaded = nd.load(init)   # save_parameters names: '0.weight', '0.bias', '1.weight', ...
    arg_params = {'fc%d_%s' % (int(k.split('.')[0]) + 1, k.split('.')[1]): v * factor
                  for k, v in loaded.items()}
    from mxmp._src.training.module import Module  # not exported by every mxmp version
    mod = Module(module_symbol(), target_dtype=dtype, emulate=True, loss_scaler=scaler,
                 cast_params=cast_params)
    mod.bind(data_shapes=[('data', (rows, IN_UNITS))], label_shapes=[('softmax_label', (rows,))])
    mod.init_params(arg_params=arg_params, aux_params={})
    # MXNet's Module divides by batch * num_workers for dist_sync itself.
    mod.init_optimizer(kvstore=kv, optimizer='sgd',
                       optimizer_params={'learning_rate': lr, 'momentum': 0.9})

    def step_fn(x, y, mult):
        x = x * np.where(np.isinf(mult), np.inf, 1.0).astype(np.float32)[:, None]
        mod.forward_backward(mx.io.DataBatch([nd.array(x)], [nd.array(y)]))
        return mod.update(), float('nan')

    def read_params():
        return {k: v.asnumpy() for k, v in mod.get_params()[0].items()}

    return step_fn, read_params, lambda: (mod.loss_scale, mod.skipped_steps)


def save_records(records, path):
    """Write :func:`train`'s records to ``path`` (npz, see the module docstring)."""
    arrays = {'loss_scale': np.array(records['loss_scale'], np.float64),
              'skipped_steps': np.array(records['skipped_steps'], np.int64),
              'applied': np.array(records['applied'], bool),
              'loss_sum': np.array(records['loss_sum'], np.float64),
              'rounded_masters': np.array(records['rounded_masters'], bool),
              'param_dtypes': np.array(records['param_dtypes'], dtype='U16'),
              'num_workers': np.array(records['num_workers']),
              'bytes_pushed': np.array(records['bytes_pushed'], np.int64),
              'exchange_dtypes': np.array(records['exchange_dtypes'], dtype='U16')}
    for step, params in enumerate(records['params']):
        for name, value in params.items():
            arrays['k%d/%s' % (step, name)] = value
    tmp = path + '.tmp.npz'
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', required=True, help='output directory')
    parser.add_argument('--init', required=True, help='initial parameters file')
    parser.add_argument('--kvstore', default='dist_sync')
    parser.add_argument('--steps', type=int, default=6)
    parser.add_argument('--batch', type=int, default=8, help='rows per worker per step')
    parser.add_argument('--num-shards', type=int, default=None)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--inf-step', type=int, default=-1)
    parser.add_argument('--inf-rank', type=int, default=1)
    parser.add_argument('--cast-params', action='store_true')
    parser.add_argument('--dtype', choices=('bfloat16', 'float32'), default='bfloat16')
    parser.add_argument('--api', choices=('gluon', 'module'), default='gluon')
    parser.add_argument('--grad-dtype', default=None, help='mxmp.Trainer grad_dtype')
    parser.add_argument('--perturb-other-ranks', action='store_true',
                        help='ranks other than 0 start from twice the initial values')
    parser.add_argument('--hang', action='store_true',
                        help='sleep forever after the kvstore is up (launcher tests)')
    parser.add_argument('--fail-rank', type=int, default=-1,
                        help='this rank exits with code 3 after the kvstore is up '
                             '(launcher tests)')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    if args.hang or args.fail_rank >= 0:
        kv = mx.kv.create(args.kvstore)
        logging.info('rank %d up', kv.rank)
        if kv.rank == args.fail_rank:
            logging.info('rank %d fails on purpose', kv.rank)
            os._exit(3)   # no kvstore shutdown: a crashed worker
        if args.hang:
            import time
            while True:
                time.sleep(1)
        kv.barrier()   # the surviving workers block here: the launcher must stop them
        return 0
    records = train(args.init, args.steps, args.batch, kvstore=args.kvstore,
                    num_shards=args.num_shards, seed=args.seed, inf_step=args.inf_step,
                    inf_rank=args.inf_rank, cast_params=args.cast_params, dtype=args.dtype,
                    api=args.api, grad_dtype=args.grad_dtype,
                    perturb_other_ranks=args.perturb_other_ranks)
    save_records(records, os.path.join(args.out, 'rank%d.npz' % records['rank']))
    return 0


if __name__ == '__main__':
    sys.exit(main())
