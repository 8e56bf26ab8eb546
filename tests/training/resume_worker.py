"""Train a small mixed-precision model for a range of steps, for the bitwise-resume tests.

Run as a script (one process per run, so a resumed run shares nothing with the first one but
its checkpoint files)::

    python tests/training/resume_worker.py --api gluon --dtype float16 --steps 6 --save-at 3 \
        --ckpt DIR --out first.npz
    python tests/training/resume_worker.py --api gluon --dtype float16 --steps 6 --resume \
        --ckpt DIR --out resumed.npz

The first command trains steps 0..5, checkpointing *everything* after step 3 (index 2); the
second loads that checkpoint in a new process and trains the remaining steps. ``--out`` gets a
``.npz`` of every number the run ends with (float32 views of the parameters, master weights,
optimizer states, update counts, loss scale, skipped steps, per-step losses) for
``np.testing.assert_array_equal``.

What a checkpoint holds, and how the run is made reproducible at step granularity:

* parameters (``net.save_parameters`` / ``Module.save_checkpoint``), optimizer states with the
  optimizer itself (update counts, learning-rate schedule), float32 master weights and the
  loss scaler (``mxmp.Trainer.save_states`` / ``prefix-%04d.mxmp.json``);
* the data position: the step number and the state of the numpy generator that draws the
  batches (``np.random.RandomState.get_state``), in ``progress.pkl``;
* MXNet's generator (Dropout masks): MXNet 1.9.1 cannot read its generator state back (no
  ``get_state`` in ``mx.random``), so every step reseeds it from ``(seed, step)``; a resumed
  run then draws the same masks as an uninterrupted one.

Every file is written with ``mxmp._src.files.write_atomic`` (or MXNet's writer then a rename).
Injected overflow: ``--overflow-at K`` sets one gradient element to inf after backward at step K
(a skipped step, a backed-off loss scale).
"""
import argparse
import os
import pickle
import sys

import numpy as np

FEATURES, CLASSES, BATCH, SAMPLES = 8, 4, 16, 96


def seed_for(seed, step):
    """The mx.random seed of one step: depends only on the run's seed and the step."""
    return seed * 100003 + step


def make_data(seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(SAMPLES, FEATURES).astype(np.float32)
    y = (x @ rng.randn(FEATURES, CLASSES)).argmax(1).astype(np.float32)
    return x, y


def f32(arr):
    from mxnet import nd
    return nd.amp_cast(arr, dtype='float32').asnumpy()


def make_scaler(kind):
    from mxmp._src.scaling import DynamicLossScaler
    if kind == 'dynamic':
        return DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=2)
    return kind   # 'auto', 'none'


# --------------------------------------------------------------------------------- Gluon
class GluonRun:
    """mxmp.convert + mxmp.Trainer (Adam with a learning-rate schedule) on a Dense/BatchNorm/
    Dropout net, low-precision parameters stored in the target dtype (cast_params)."""

    def __init__(self, args):
        import mxnet as mx
        from mxnet import gluon
        from mxnet.gluon import nn
        import mxmp
        mx.random.seed(args.seed)
        with mx.name.NameManager():
            net = nn.HybridSequential(prefix='net_')
            with net.name_scope():
                net.add(nn.Dense(16, in_units=FEATURES), nn.BatchNorm(in_channels=16),
                        nn.Activation('relu'), nn.Dropout(0.25), nn.Dense(CLASSES, in_units=16))
        net.initialize(mx.init.Xavier())
        self.net = net
        self.train_net = mxmp.convert(net, args.dtype, cast_params=True, emulate=True)
        self.train_net.hybridize()
        schedule = mx.lr_scheduler.FactorScheduler(step=2, factor=0.7, base_lr=0.01)
        self.trainer = mxmp.Trainer(self.train_net.collect_params(), 'adam',
                                    {'learning_rate': 0.01, 'wd': 1e-3,
                                     'lr_scheduler': schedule},
                                    loss_scaler=make_scaler(args.scaler))
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step(self, x, y, overflow):
        from mxnet import autograd, nd
        x, y = nd.array(x), nd.array(y)
        with autograd.record():
            loss = self.loss_fn(self.train_net(x), y)
            with self.trainer.scale_loss(loss) as scaled:
                scaled.backward()
        if overflow:
            param = sorted(self.net.collect_params().items())[0][1]
            param.grad()[0] = np.inf
        self.trainer.step(x.shape[0])
        return float(loss.mean().asscalar())

    def status(self):
        return self.trainer.loss_scale, self.trainer.skipped_steps

    def save(self, ckpt):
        self.net.save_parameters(os.path.join(ckpt, 'net.params'))
        self.trainer.save_states(os.path.join(ckpt, 'trainer.states'))

    def load(self, ckpt):
        self.net.load_parameters(os.path.join(ckpt, 'net.params'))
        self.trainer.load_states(os.path.join(ckpt, 'trainer.states'))

    def result(self):
        out = {}
        for name, param in sorted(self.net.collect_params().items()):
            out['param:' + name] = f32(param.data())
            if param.dtype != np.float32 and param.grad_req != 'null':
                out['master:' + name] = self.trainer.master_weights(param)[0].asnumpy()
        opt = self.trainer._optimizer
        for idx, state in sorted(self.trainer._updaters[0].states.items()):
            flat = state if isinstance(state, (list, tuple)) else [state]
            for k, s in enumerate(flat):
                if s is not None:
                    out['state:%d:%d' % (idx, k)] = s.asnumpy()
        out['update_counts'] = np.array(sorted(opt._index_update_count.items()))
        out['num_update'] = np.array(opt.num_update)
        out['lr'] = np.array(self.trainer.learning_rate)
        out['loss_scale'] = np.array(self.trainer.loss_scale)
        out['skipped_steps'] = np.array(self.trainer.skipped_steps)
        return out


# --------------------------------------------------------------------------------- Module
class ModuleRun:
    """mxmp.Module (SGD with momentum, weight decay and a learning-rate schedule) on a
    FullyConnected/BatchNorm/Dropout/SoftmaxOutput graph, cast_params, checkpoints through
    ``Module.save_checkpoint`` / ``Module.load``."""

    def __init__(self, args):
        import mxnet as mx
        self.args = args
        mx.random.seed(args.seed)
        data = mx.sym.var('data')
        h = mx.sym.FullyConnected(data, num_hidden=16, name='fc1')
        h = mx.sym.BatchNorm(h, fix_gamma=False, name='bn1')
        h = mx.sym.Dropout(mx.sym.Activation(h, act_type='relu'), p=0.25, name='drop1')
        out = mx.sym.FullyConnected(h, num_hidden=CLASSES, name='fc2')
        self.sym = mx.sym.SoftmaxOutput(out, name='softmax')
        self.kwargs = dict(target_dtype=args.dtype, emulate=True, cast_params=True,
                           loss_scaler=make_scaler(args.scaler))
        self.mod = None

    def _ready(self, mod, fresh):
        import mxnet as mx
        mod.bind(data_shapes=[('data', (BATCH, FEATURES))],
                 label_shapes=[('softmax_label', (BATCH,))])
        if fresh:
            mod.init_params(mx.init.Xavier())
        schedule = mx.lr_scheduler.FactorScheduler(step=2, factor=0.7, base_lr=0.1)
        mod.init_optimizer(optimizer=self.args.module_optimizer,
                           optimizer_params={'learning_rate': 0.1, 'momentum': 0.9,
                                             'wd': 1e-3, 'lr_scheduler': schedule}
                           if self.args.module_optimizer == 'sgd' else
                           {'learning_rate': 0.01, 'wd': 1e-3, 'lr_scheduler': schedule})
        self.mod = mod

    def fresh(self):
        import mxmp
        self._ready(mxmp.Module(self.sym, **self.kwargs), fresh=True)

    def step(self, x, y, overflow):
        import mxnet as mx
        from mxnet import nd
        self.mod.forward_backward(mx.io.DataBatch([nd.array(x)], [nd.array(y)]))
        if overflow:
            self.mod._exec_group.grad_arrays[0][0][0] = np.inf
        prob = self.mod.get_outputs()[0].asnumpy()
        self.mod.update()
        return float(-np.log(prob[np.arange(len(y)), y.astype(int)] + 1e-12).mean())

    def status(self):
        return self.mod.loss_scale, self.mod.skipped_steps

    def save(self, ckpt):
        self.mod.save_checkpoint(os.path.join(ckpt, 'mod'), 1, save_optimizer_states=True)

    def load(self, ckpt):
        import mxmp
        kwargs = dict(self.kwargs)
        kwargs.pop('loss_scaler')   # restored from mod-0001.mxmp.json
        self._ready(mxmp.Module.load(os.path.join(ckpt, 'mod'), 1, load_optimizer_states=True,
                                     **kwargs), fresh=False)

    def result(self):
        mod = self.mod
        out = {}
        arg, aux = mod.get_params()
        for name, value in sorted(list(arg.items()) + list(aux.items())):
            out['param:' + name] = value.asnumpy()
        group = mod._exec_group
        for name, arrays in zip(group.param_names, group.param_arrays):
            out['device:' + name] = f32(arrays[0])
        for idx, state in sorted(mod._updater.states.items()):
            flat = state if isinstance(state, (list, tuple)) else [state]
            for k, s in enumerate(flat):
                if s is not None:
                    out['state:%d:%d' % (idx, k)] = s.asnumpy()
        opt = mod._optimizer
        out['update_counts'] = np.array(sorted(opt._index_update_count.items()))
        out['num_update'] = np.array(opt.num_update)
        out['loss_scale'] = np.array(mod.loss_scale)
        out['skipped_steps'] = np.array(mod.skipped_steps)
        return out


# --------------------------------------------------------------------------------- driver
def run(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--api', choices=('gluon', 'module'), required=True)
    p.add_argument('--dtype', choices=('bfloat16', 'float16'), required=True)
    p.add_argument('--scaler', choices=('auto', 'none', 'dynamic'), default='auto')
    p.add_argument('--module-optimizer', choices=('sgd', 'adam'), default='sgd')
    p.add_argument('--steps', type=int, required=True, help='total steps of the run')
    p.add_argument('--save-at', type=int, default=None, help='checkpoint after this many steps')
    p.add_argument('--resume', action='store_true', help='start from the checkpoint in --ckpt')
    p.add_argument('--ckpt', required=True)
    p.add_argument('--overflow-at', type=int, action='append', default=[])
    p.add_argument('--seed', type=int, default=7)
    p.add_argument('--out', required=True)
    args = p.parse_args(argv)

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import mxnet as mx
    from mxmp._src.files import write_atomic

    job = GluonRun(args) if args.api == 'gluon' else ModuleRun(args)
    x, y = make_data(args.seed)
    if args.resume:
        job.load(args.ckpt)
        with open(os.path.join(args.ckpt, 'progress.pkl'), 'rb') as fin:
            progress = pickle.load(fin)
        start, losses = progress['step'], progress['losses']
        rng = np.random.RandomState()
        rng.set_state(progress['data_rng'])
    else:
        if args.api == 'module':
            job.fresh()
        start, losses, rng = 0, [], np.random.RandomState(args.seed + 1)
    for step in range(start, args.steps):
        mx.random.seed(seed_for(args.seed, step))
        idx = rng.choice(SAMPLES, BATCH, replace=False)   # the data position is rng's state
        losses.append(job.step(x[idx], y[idx], step in args.overflow_at))
        if args.save_at is not None and step + 1 == args.save_at:
            os.makedirs(args.ckpt, exist_ok=True)
            job.save(args.ckpt)
            write_atomic(os.path.join(args.ckpt, 'progress.pkl'), pickle.dumps(
                {'step': step + 1, 'losses': list(losses), 'data_rng': rng.get_state(),
                 'status': job.status()}))
    result = job.result()
    result['losses'] = np.array(losses)
    np.savez(args.out, **result)


if __name__ == '__main__':
    run()
