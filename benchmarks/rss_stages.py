"""Where a benchmark run's memory goes: resident memory after each stage of one process.

``python -m benchmarks.rss_stages --model bert_base --batch-size 8 --seq-len 128 --phase infer
--mode mxmp_cast_params`` builds the workload of :mod:`benchmarks.workloads` (any ``--model``
of ``scripts/benchmark.py``), runs the mode as the benchmark's worker does (float32:
``gluon.Trainer``; mxmp modes: ``mxmp.convert`` and ``mxmp.Trainer``; hybridized with
``static_alloc`` and ``static_shape``) and prints, after each stage, the process's current
resident memory (``VmRSS``) and its peak so far (``VmHWM``, what the benchmark reports as peak
RSS), in MiB, and the bytes held by the network's Parameters (weights, gradients) and by the
optimizer state, counted from the arrays themselves. Training stages: each step's forward,
backward and update separately (each waited for). Inference: the first call, then
``--iters`` more.

``--freeze`` (inference) runs :func:`mxmp.freeze` on the converted network before the calls.
``--kernels`` and ``--cast-moved-params`` set those fields of the mxmp modes' policy.
``--allocated`` adds the peak of MXNet's own allocations (``mx.profiler`` memory profile) so
far to each stage's line after the network is built, and at the end. Set environment variables (``MXNET_MKLDNN_CACHE_NUM``...) on the command line to try
one lever per process. One process, one configuration; memory does not depend on the load of
the machine, time does (not printed here).
"""
import argparse
import atexit
import os
import tempfile

import numpy as np

from benchmarks.modes import LEARNING_RATE, MOMENTUM, SEED
from benchmarks.workloads import workload_for

MODES = ('float32', 'mxmp', 'mxmp_cast_params')


def status_mib():
    """(VmRSS, VmHWM) of this process in MiB, from /proc/self/status (Linux)."""
    values = {}
    with open('/proc/self/status') as f:
        for line in f:
            key, _, rest = line.partition(':')
            if key in ('VmRSS', 'VmHWM'):
                values[key] = int(rest.split()[0]) / 1024.0  # kB
    return values['VmRSS'], values['VmHWM']


def array_mib(arrays):
    """MiB held by ``arrays`` (NDArrays; None skipped), by shape and dtype (distinct arrays
    counted once)."""
    seen, total = set(), 0
    for a in arrays:
        if a is None or id(a) in seen:
            continue
        seen.add(id(a))
        total += int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
    return total / 2.0 ** 20


def parameter_mib(net):
    """{'weights': MiB, 'gradients': MiB, 'weights_by_dtype': {dtype: MiB}} of ``net``'s
    Parameters."""
    from mxmp._src.dtypes import dtype_name
    weights, grads, by_dtype = [], [], {}
    for p in net.collect_params().values():
        if p._data is None:
            continue
        weights += p._data
        grads += p._grad or []
        for d in p._data:
            name = dtype_name(d.dtype)
            by_dtype[name] = by_dtype.get(name, 0.0) + array_mib([d])
    return {'weights': array_mib(weights), 'gradients': array_mib(grads),
            'weights_by_dtype': by_dtype}


def optimizer_mib(trainer):
    """(MiB of the optimizer state, MiB of mxmp's float32 master weights) of a Gluon or mxmp
    Trainer."""
    arrays = []

    def walk(state):
        if state is None:
            return
        if isinstance(state, (list, tuple)):
            for s in state:
                walk(s)
        elif hasattr(state, 'shape'):
            arrays.append(state)
    for updater in getattr(trainer, '_updaters', []) or []:
        for state in updater.states.values():
            walk(state)
    masters = getattr(trainer, '_masters', None)   # mxmp.Trainer's float32 master weights
    master_arrays = [a for m in (masters._masters.values() if masters else []) for a in m]
    return array_mib(arrays), array_mib(master_arrays)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='bert_base')
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--seq-len', type=int, default=128)
    p.add_argument('--input-size', type=int, default=224)
    p.add_argument('--classes', type=int, default=1000)
    p.add_argument('--phase', choices=('train', 'infer'), default='train')
    p.add_argument('--mode', choices=MODES, default='mxmp')
    p.add_argument('--steps', type=int, default=3, help='training steps or inference calls')
    p.add_argument('--dropout', type=float, default=None,
                   help="text models: dropout of every layer (default: the model's own, 0.1; "
                        "0 removes GluonNLP's Dropout layers: what they cost)")
    p.add_argument('--fuse-inference', choices=('auto', 'off'), default='auto',
                   help="mxmp modes: convert's fuse_inference ('off': False)")
    p.add_argument('--grad-req', choices=('write', 'null'), default='write',
                   help="inference: the Parameters' grad_req, set before the first call "
                        "('null': no gradient arrays, as an inference-only process would; "
                        "default 'write', as the benchmark's inference rows)")
    p.add_argument('--freeze', action='store_true',
                   help='inference: mxmp.freeze the converted network (first batch) first')
    p.add_argument('--excluded-names', nargs='*', default=(),
                   help='mxmp modes: graph nodes kept in float32 (Policy.excluded_names), e.g. '
                        "the encoder-decoder's output layer seq2seq_out_fwd")
    p.add_argument('--kernels', choices=('auto', 'all', 'mxnet'), default='auto',
                   help="mxmp modes: the policy's kernels ('mxnet': MXNet's kernels only, "
                        "'all': mxmp's Dropout too)")
    p.add_argument('--cast-moved-params', choices=('on', 'off'), default='on',
                   help="mxmp_cast_params: the policy's cast_moved_params ('off': the weights "
                        "BERT concatenates stay float32)")
    p.add_argument('--allocated', action='store_true',
                   help="also the peak of MXNet's own allocations (mx.profiler)")
    args = p.parse_args(argv)
    import mxnet as mx
    from mxnet import autograd, gluon
    import mxmp
    stages = []
    profiling = []

    def allocated_mib():
        from benchmarks.profile import parse_aggregate
        row = parse_aggregate(mx.profiler.dumps(reset=False))['Device Storage']['Memory: cpu/0']
        return row['max_ms'] / 1024.0

    def mark(stage, net=None, trainer=None):
        mx.nd.waitall()
        rss, hwm = status_mib()
        extra = ''
        if net is not None:
            params = parameter_mib(net)
            extra = '; parameters %.0f MiB (%s), gradients %.0f MiB' % (
                params['weights'], ', '.join('%s %.0f' % kv for kv in
                                             sorted(params['weights_by_dtype'].items())),
                params['gradients'])
        if trainer is not None:
            extra += '; optimizer state %.0f MiB, master weights %.0f MiB' % optimizer_mib(
                trainer)
        if profiling:   # the profiler's aggregate so far (not reset)
            extra += "; MXNet's allocations peak so far %.0f MiB" % allocated_mib()
        stages.append((stage, rss, hwm))
        print('%-28s RSS %6.0f MiB, peak %6.0f MiB%s' % (stage, rss, hwm, extra), flush=True)

    mark('import')
    if args.allocated:
        trace = os.path.join(tempfile.gettempdir(), 'rss_stages_%d.json' % os.getpid())
        atexit.register(lambda: os.path.exists(trace) and os.remove(trace))
        mx.profiler.set_config(profile_memory=True, aggregate_stats=True, profile_all=False,
                               profile_symbolic=False, profile_imperative=False,
                               profile_api=False, filename=trace)
        mx.profiler.set_state('run')
        profiling.append(True)
    mx.random.seed(SEED)
    np.random.seed(SEED)
    spec = dict(model=args.model, batch_size=args.batch_size, seq_len=args.seq_len,
                input_size=args.input_size, classes=args.classes)
    wl = workload_for(spec)
    ctx = mx.cpu()
    batches = wl.batches(mx, args.batch_size, ctx)
    if args.dropout is not None and wl.unit == 'img':
        p.error('--dropout is for the text models (the CNNs have no dropout knob)')
    net = wl.model(dropout=args.dropout)
    wl.initialize(net, mx, ctx)
    if args.phase == 'infer' and args.grad_req == 'null':
        net.collect_params().setattr('grad_req', 'null')
    mark('built and initialized', net)
    if args.mode != 'float32':
        policy = mxmp.Policy('bfloat16', excluded_names=tuple(args.excluded_names),
                             kernels=args.kernels,
                             cast_moved_params=args.cast_moved_params == 'on',
                             param_dtype='bfloat16' if args.mode == 'mxmp_cast_params'
                             else 'float32')
        net = mxmp.convert(net, policy=policy,
                           fuse_inference='auto' if args.fuse_inference == 'auto' else False)
        mark('converted', net)
    net.hybridize(static_alloc=True, static_shape=True)
    if args.freeze:
        if args.mode == 'float32' or args.phase != 'infer':
            p.error('--freeze is for the inference of an mxmp mode')
        net = mxmp.freeze(net, *batches[0][0])
        mark('frozen (and called once)', net)
    opt = {'learning_rate': LEARNING_RATE, 'momentum': MOMENTUM}
    if args.phase == 'infer':
        for k in range(args.steps):
            net(*batches[k % len(batches)][0])
            mark('inference call %d' % k, net)
    else:
        trainer = (gluon.Trainer if args.mode == 'float32' else mxmp.Trainer)(
            net.collect_params(), 'sgd', opt)
        loss_fn = wl.loss(gluon)
        for k in range(args.steps):
            xs, y = batches[k % len(batches)]
            with autograd.record():
                loss = loss_fn(net(*xs), y)
                mark('step %d forward' % k)
                if args.mode == 'float32':
                    loss.backward()
                else:
                    with trainer.scale_loss(loss) as scaled:
                        scaled.backward()
            mark('step %d backward' % k, net)
            trainer.step(args.batch_size)
            mark('step %d update' % k, net, trainer)
    if args.allocated:
        mx.profiler.set_state('stop')
        print("MXNet's allocations peak %.0f MiB" % allocated_mib())
    print('%s %s %s batch %d: peak RSS %.0f MiB' % (args.model, args.phase, args.mode,
                                                    args.batch_size, stages[-1][2]))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
