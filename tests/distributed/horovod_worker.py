#!/usr/bin/env python3
"""Worker of tests/distributed/test_horovod.py: every Horovod check in one ``horovodrun`` job.

Run as ``horovodrun --gloo -np 2 -H localhost:2 python horovod_worker.py --out DIR --init FILE``
(each ``horovodrun`` costs seconds of process start-up, so one job runs every part in turn, each
with its own Horovod tensor-name prefix). Each rank writes, for every part, ``DIR/<part>/
rank<r>.npz`` and ``DIR/<part>/rank<r>.json`` (``{"error": traceback or null, ...}``); a part
that raises is recorded and the next part runs.

Parts (data, initial values, overflow: those of tests/distributed/dist_worker.py; an inf on
rank 1's loss alone at step ``--inf-step``):

* ``mxmp_bfloat16``, ``mxmp_float32``, ``mxmp_cast_params``, ``mxmp_cast_params_float16``:
  ``dist_worker.train(kvstore='horovod')``, :class:`mxmp.horovod.DistributedTrainer` on the
  emulated bfloat16 MLP (float32: not converted; ``cast_params``: bfloat16 Parameters with float32
  master weights; ``float16``: gradients summed in float16); every rank but 0 starts from
  twice the initial values (the broadcast puts rank 0's everywhere).
* ``contrib_amp``: the pattern of published Horovod scripts (e.g. GluonCV's Faster-RCNN
  training) on mxmp.amp: ``amp.init()`` (float16, emulated on a CPU), the network,
  ``hvd.broadcast_parameters``, ``hvd.DistributedTrainer``, ``amp.init_trainer(trainer)``,
  ``amp.scale_loss(loss, trainer)``, ``trainer.step(batch)``. Recorded per step: whether this
  rank's own gradients were finite before the all-reduce, the loss scale, the parameters
  (``k<step>/<name>``, and ``init/<name>`` after the broadcast; ``ref_``: the reference's);
  then the reference: the same script on one process with two devices, each with one worker's
  rows (``gluon.Trainer``, ``'device'`` kvstore). ``contrib_amp_bfloat16``: the same with
  ``amp.init(mxmp.Policy('bfloat16', loss_scaler='dynamic'))`` (bfloat16 scales no loss by
  default: nothing would be checked). They run last: ``amp.init()`` is process-wide.
* ``deferred``: a Dense with deferred initialisation, other initial values on every rank,
  two steps of :class:`mxmp.horovod.DistributedTrainer`: a digest of the parameters; then the
  options it refuses (``grad_dtype='bfloat16'``, ``'float16'`` without a dynamic scaler, two
  contexts), their messages in the JSON.
"""
import argparse
import hashlib
import json
import os
import sys
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dist_worker  # noqa: E402  (puts the repository on sys.path)

import horovod.mxnet as hvd  # noqa: E402
import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon, nd  # noqa: E402

#: part -> keyword arguments of dist_worker.train
MXMP_PARTS = {
    'mxmp_bfloat16': {'perturb_other_ranks': True},
    'mxmp_float32': {'dtype': 'float32'},
    'mxmp_cast_params': {'cast_params': True, 'perturb_other_ranks': True},
    'mxmp_cast_params_float16': {'cast_params': True, 'perturb_other_ranks': True,
                                 'grad_dtype': 'float16'},
}


def mxmp_part(name, args):
    records = dist_worker.train(args.init, args.steps, args.batch, kvstore='horovod',
                                seed=args.seed, inf_step=args.inf_step,
                                inf_rank=args.inf_rank, hvd_prefix=name + '.', **MXMP_PARTS[name])
    dist_worker.save_records(records, os.path.join(args.out, name, 'rank%d.npz' % hvd.rank()))
    return {}


def _amp_train(args, trainer_of, net, ctxs, lo, step_batch):
    """The contrib.amp training loop of published scripts, on rows ``[lo, lo + 8 * len(ctxs))``
    of each global batch split over ``ctxs``; per-step records."""
    from mxmp import amp
    trainer = trainer_of(net.collect_params())
    amp.init_trainer(trainer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    params = net.collect_params()
    out = {'local_finite': [], 'loss_scale': [], 'params': [],
           'init': {k: p.data(ctxs[0]).asnumpy() for k, p in params.items()}}
    rows = args.batch * len(ctxs)
    for step in range(args.steps):
        x, y = dist_worker.global_batch(step, 2 * args.batch, args.seed)
        mult = np.ones(2 * args.batch, np.float32)
        if step == args.inf_step:
            mult[args.inf_rank * args.batch:(args.inf_rank + 1) * args.batch] = np.inf
        parts = [gluon.utils.split_and_load(a[lo:lo + rows], ctxs) for a in (x, y, mult)]
        with autograd.record():
            losses = [loss_fn(net(xi), yi) * mi for xi, yi, mi in zip(*parts)]
            with amp.scale_loss(losses, trainer) as scaled:
                autograd.backward(scaled)
        out['local_finite'].append([bool(all(np.isfinite(p.grad(ctx).asnumpy()).all()
                                             for p in params.values())) for ctx in ctxs])
        trainer.step(step_batch)
        out['loss_scale'].append(float(trainer._amp_loss_scaler.loss_scale))
        out['params'].append({k: p.data(ctxs[0]).asnumpy() for k, p in params.items()})
    return out


def contrib_amp_part(args, name):
    import mxmp
    from mxmp import amp
    if name == 'contrib_amp':
        amp.init()   # as the published scripts: float16, before the network is built
    else:   # bfloat16 scales no loss by default, so nothing would be checked
        amp.init(mxmp.Policy('bfloat16', loss_scaler='dynamic'))
    rank, batch = hvd.rank(), args.batch

    def network(factor, ctxs):
        net = dist_worker.make_net()
        net.load_parameters(args.init, ctx=ctxs)
        for param in net.collect_params().values():
            param.set_data(param.data(ctxs[0]) * factor)
        net.hybridize()
        return net

    net = network(2.0 if rank > 0 else 1.0, [mx.cpu()])   # rank 0's values must reach all
    hvd.broadcast_parameters(net.collect_params(), root_rank=0, prefix=name + '.init.')
    dist = _amp_train(args, lambda params: hvd.DistributedTrainer(
        params, 'sgd', {'learning_rate': 0.1, 'momentum': 0.9}, prefix=name + '.'),
        net, [mx.cpu()], rank * batch, batch)
    # The reference: one process, two devices, each with one worker's rows (the same float16
    # rounding per device, so the same overflows), gradients summed by the 'device' kvstore.
    ref = _amp_train(args, lambda params: gluon.Trainer(
        params, 'sgd', {'learning_rate': 0.1, 'momentum': 0.9}, kvstore='device'),
        network(1.0, [mx.cpu(0), mx.cpu(1)]), [mx.cpu(0), mx.cpu(1)], 0, 2 * batch)
    arrays = {'local_finite': np.array(dist['local_finite'])[:, 0],
              'loss_scale': np.array(dist['loss_scale']),
              'ref_local_finite': np.array(ref['local_finite']),
              'ref_loss_scale': np.array(ref['loss_scale'])}
    for prefix, run in (('', dist), ('ref_', ref)):
        for key, value in run['init'].items():   # the values step 0 starts from
            arrays['%sinit/%s' % (prefix, key)] = value
        for step, params in enumerate(run['params']):
            for key, value in params.items():
                arrays['%sk%d/%s' % (prefix, step, key)] = value
    np.savez(os.path.join(args.out, name, 'rank%d.npz' % rank), **arrays)
    return {}


def deferred_part(args):
    import mxmp
    from mxmp.horovod import DistributedTrainer
    rank = hvd.rank()
    mx.random.seed(100 + rank)                 # every rank draws other initial values
    net = gluon.nn.Dense(3)                    # in_units unknown: deferred initialisation
    net.initialize(mx.init.Xavier())
    trainer = DistributedTrainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
                                 loss_scaler='dynamic', prefix='deferred.')
    applied = []
    for _ in range(2):
        x = nd.array([[rank + 1.0, 2.0]])
        with autograd.record():
            loss = net(x).sum()
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        applied.append(bool(trainer.step(1)))
    digest = hashlib.sha256(b''.join(p.data().asnumpy().tobytes()
                                     for p in net.collect_params().values())).hexdigest()
    refused = {}
    for key, bad in (('grad_dtype=bfloat16', {'grad_dtype': 'bfloat16'}),
                     ('float16 without dynamic', {'grad_dtype': 'float16',
                                                  'loss_scaler': 'none'})):
        try:
            DistributedTrainer(net.collect_params(), 'sgd', prefix='bad.', **bad)
        except ValueError as err:
            refused[key] = str(err)
    two = gluon.nn.Dense(2, in_units=2)
    two.initialize(ctx=[mx.cpu(0), mx.cpu(1)])
    try:
        DistributedTrainer(two.collect_params(), 'sgd', prefix='two.')
    except ValueError as err:
        refused['two contexts'] = str(err)
    return {'applied': applied, 'digest': digest, 'refused': refused,
            'mxmp': mxmp.__file__}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', required=True)
    parser.add_argument('--init', required=True, help="dist_worker.write_init's file")
    parser.add_argument('--steps', type=int, default=6)
    parser.add_argument('--batch', type=int, default=8, help='rows per worker per step')
    parser.add_argument('--seed', type=int, default=1, help='data seed')
    parser.add_argument('--inf-step', type=int, default=3)
    parser.add_argument('--inf-rank', type=int, default=1)
    parser.add_argument('--parts', default=','.join(
        list(MXMP_PARTS) + ['deferred', 'contrib_amp', 'contrib_amp_bfloat16']))
    args = parser.parse_args(argv)
    hvd.init()
    for name in args.parts.split(','):
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        result = {'rank': hvd.rank(), 'size': hvd.size(), 'error': None}
        try:
            if name in MXMP_PARTS:
                result.update(mxmp_part(name, args))
            elif name == 'deferred':
                result.update(deferred_part(args))
            elif name.startswith('contrib_amp'):
                result.update(contrib_amp_part(args, name))
            else:
                raise ValueError('unknown part %r' % name)
        except Exception:  # recorded for the test; the next part runs
            result['error'] = traceback.format_exc()
        path = os.path.join(args.out, name, 'rank%d.json' % hvd.rank())
        with open(path, 'w') as f:
            json.dump(result, f)
        print('rank %d part %s: %s' % (hvd.rank(), name,
                                       'error' if result['error'] else 'done'), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
