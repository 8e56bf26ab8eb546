"""Does MXNet 1.9.1 recompute an in-graph weight cast in the backward pass (memory mirroring)
instead of keeping its bfloat16 output?

``MXNET_BACKWARD_DO_MIRROR=1 python -m benchmarks.mirror_probe gluon`` (or ``executor``, or
``executor_force``: the casts carry ``__force_mirroring__``) builds 8 bfloat16 FullyConnected
layers (1024 x 1024, no bias), each behind an ``amp_cast`` of its float32 weight, runs 2 training
steps of batch 16 and prints the peak of MXNet's own allocations (``mx.profiler`` memory profile,
kB of 1000 bytes; exact, the same on every run). ``gluon``: a SymbolBlock hybridized with
``static_alloc`` (Gluon's CachedOp); ``executor``: ``Symbol.bind`` (the Module's executor). One
configuration per process: the variable is read when a graph is built. Results:
docs/benchmark.md ("BERT-base memory", memory mirroring).
"""
import argparse
import os
import tempfile

LAYERS, UNITS, BATCH = 8, 1024, 16


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('runner', choices=('gluon', 'executor', 'executor_force'))
    args = p.parse_args(argv)
    import mxnet as mx
    from mxnet import autograd
    from mxnet.contrib.amp.amp import bfloat16
    data = mx.sym.var('data')
    x = data
    for i in range(LAYERS):
        attr = {'__force_mirroring__': 'True'} if args.runner == 'executor_force' else None
        w = mx.sym.amp_cast(mx.sym.var('w%d' % i), dtype=bfloat16, name='cast%d' % i, attr=attr)
        x = mx.sym.FullyConnected(x, w, num_hidden=UNITS, no_bias=True, name='fc%d' % i)
    loss = mx.sym.make_loss(mx.sym.sum(mx.sym.amp_cast(x, dtype='float32')))
    values = {'data': mx.nd.amp_cast(mx.nd.ones((BATCH, UNITS)), dtype=bfloat16)}
    values.update({'w%d' % i: mx.nd.random.uniform(-0.03, 0.03, (UNITS, UNITS))
                   for i in range(LAYERS)})
    mx.nd.waitall()
    trace = os.path.join(tempfile.gettempdir(), 'mirror_probe_%d.json' % os.getpid())
    mx.profiler.set_config(profile_memory=True, aggregate_stats=True, profile_all=False,
                           profile_symbolic=False, profile_imperative=False, profile_api=False,
                           filename=trace)
    mx.profiler.set_state('run')
    if args.runner == 'gluon':
        net = mx.gluon.SymbolBlock(loss, [data])
        net.collect_params().initialize()
        for name, param in net.collect_params().items():
            param.set_data(values[name])
        net.hybridize(static_alloc=True, static_shape=True)
        for _ in range(2):
            with autograd.record():
                out = net(values['data'])
            out.backward()
            mx.nd.waitall()
    else:
        grads = {k: mx.nd.zeros((UNITS, UNITS)) for k in values if k != 'data'}
        reqs = {k: 'null' if k == 'data' else 'write' for k in values}
        exe = loss.bind(mx.cpu(), values, args_grad=grads, grad_req=reqs)
        for _ in range(2):
            exe.forward(is_train=True)
            exe.backward()
            mx.nd.waitall()
    mx.profiler.set_state('stop')
    row = [line for line in mx.profiler.dumps().splitlines() if 'Memory: cpu/0' in line][0]
    if os.path.exists(trace):
        os.remove(trace)
    print('%s MXNET_BACKWARD_DO_MIRROR=%s: MXNet allocations peak %s kB'
          % (args.runner, os.environ.get('MXNET_BACKWARD_DO_MIRROR', '0'), row.split()[4]))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
