"""Peak RSS and step time of a few mxmp training steps, to try one lever per process.

``python -m benchmarks.train_rss --model resnet50_v1 --batch-size 16 [--cast-params]
[--fp32-ops OP ...] [--excluded-names NODE ...]`` converts the GluonCV model with ``mxmp.convert``
(bfloat16; emulated where the kernels are missing; ``--fp32-ops``: ops moved to float32 by the
policy; ``--excluded-names``: nodes kept in float32, e.g. the stem convolution
``resnetv10_conv0_fwd``; ``--pad-channels 4``: the same model with an even number of stem input
channels, its images zero-padded from 3 to 4 channels and its stem weight with a zero column:
oneDNN has a blocked-layout bfloat16 kernel for the stem then; the peak RSS of such a run also
holds the unpadded copy the weights come from, about 170 MiB for resnet18_v1; ``--pad-stem``:
``mxmp.convert``'s ``pad_stem``, the same padding inside the converted graph, ``off`` for the
unpadded graph; the line names the padded convolutions), runs ``--steps``
SGD-with-momentum steps with :class:`mxmp.Trainer` on one random batch, and prints the
process's peak RSS (``ru_maxrss``, MiB), the median time of the steps after the first two
(images/s) and the losses. ``--float32``: the same steps on the float32 model with
``gluon.Trainer`` (the reference); ``--allocated``: also the peak of MXNet's own allocations
(``mx.profiler`` with ``profile_memory=True``), which is not the RSS: the RSS holds the libraries
(about 211 MiB after import) and oneDNN's own buffers, and leaves out allocated pages never
touched. Set environment variables (e.g. ``MXNET_MKLDNN_CACHE_NUM``) on the
command line to compare one lever at a time. One process, one configuration: for speed, run the
variants alternately several times (the benchmark's interleaving is not done here).
"""
import argparse
import atexit
import json
import os
import resource
import tempfile
import time

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='resnet50_v1')
    p.add_argument('--batch-size', type=int, default=16)
    p.add_argument('--input-size', type=int, default=224)
    p.add_argument('--classes', type=int, default=1000)
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--pad-channels', type=int, default=3,
                   help='zero-pad the 3-channel images and the stem weight to this many input '
                        'channels (the same function; default 3: no padding)')
    p.add_argument('--pad-stem', choices=('auto', 'on', 'off'), default='auto',
                   help="mxmp.convert's pad_stem: the stem zero-padded to an even channel count "
                        "in the graph ('auto', default: for bfloat16 with the real kernels)")
    p.add_argument('--cast-params', action='store_true')
    p.add_argument('--float32', action='store_true',
                   help='the float32 model with gluon.Trainer, no mxmp (the reference of a '
                        'memory ratio); the conversion options are then ignored')
    p.add_argument('--allocated', action='store_true',
                   help="also print the peak of MXNet's own allocations (mx.profiler with "
                        "profile_memory=True, its 'Device Storage' row, from before the model "
                        "is built): unlike the peak RSS, it counts memory MXNet allocated and "
                        "never touched, and not the libraries or oneDNN's own buffers")
    p.add_argument('--mark-phases', action='store_true',
                   help='print a line "== step N forward|backward|update" (flushed) after each '
                        'phase of each step, waiting for it first: separates the phases in a '
                        'DNNL_VERBOSE=1 log (benchmarks.dnnl_verbose); slows the steps')
    p.add_argument('--fp32-ops', nargs='*', default=(), help='ops the policy keeps in float32')
    p.add_argument('--excluded-names', nargs='*', default=(),
                   help='node names the policy keeps in float32 (Policy.excluded_names)')
    args = p.parse_args(argv)
    import mxnet as mx
    from mxnet import autograd, gluon
    from gluoncv.model_zoo import get_model
    import mxmp
    from mxmp._src.graph.stem import padded_convolutions
    if args.allocated:
        # MXNet also writes a trace file: into a temporary one, removed at exit
        trace = os.path.join(tempfile.gettempdir(), 'train_rss_profile_%d.json' % os.getpid())
        atexit.register(lambda: os.path.exists(trace) and os.remove(trace))
        mx.profiler.set_config(profile_memory=True, aggregate_stats=True, profile_all=False,
                               profile_symbolic=False, profile_imperative=False,
                               profile_api=False, filename=trace)
        mx.profiler.set_state('run')
    mx.random.seed(0)
    rng = np.random.RandomState(0)
    net = get_model(args.model, pretrained=False, classes=args.classes)
    net.initialize(mx.init.Xavier(magnitude=2))
    size = args.input_size
    x = rng.uniform(-1, 1, (args.batch_size, 3, size, size)).astype('float32')
    y = mx.nd.array(rng.randint(0, args.classes, args.batch_size))
    if args.pad_channels > 3:
        net = _padded(net, x, args, get_model)
        x = np.concatenate([x, np.zeros((args.batch_size, args.pad_channels - 3, size, size),
                                        'float32')], axis=1)
    x = mx.nd.array(x)
    if args.float32:
        block = net
        trainer = gluon.Trainer(block.collect_params(), 'sgd',
                                {'learning_rate': 0.01, 'momentum': 0.9})
    else:
        block, trainer = _converted(net, args, p, mxmp)
    block.hybridize(static_alloc=True, static_shape=True)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses, seconds = [], []

    def mark(step, phase):
        if args.mark_phases:
            mx.nd.waitall()
            print('== step %d %s' % (step, phase), flush=True)

    for step in range(args.steps):
        start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(block(x), y)
            mark(step, 'forward')
            if args.float32:
                loss.backward()
            else:
                with trainer.scale_loss(loss) as scaled:
                    scaled.backward()
        mark(step, 'backward')
        trainer.step(args.batch_size)
        mark(step, 'update')
        losses.append(float(loss.mean().asscalar()))  # synchronises: the step is done
        seconds.append(time.perf_counter() - start)
    mx.nd.waitall()
    timed = seconds[2:]
    allocated = ''
    if args.allocated:
        from benchmarks.profile import parse_aggregate
        mx.profiler.set_state('stop')
        row = parse_aggregate(mx.profiler.dumps())['Device Storage']['Memory: cpu/0']
        allocated = "; MXNet's allocations peak %.0f MiB" % (row['max_ms'] / 1024.0)  # kB
    if args.float32:
        head = '%s batch %d float32 (no mxmp)' % (args.model, args.batch_size)
    else:
        head = '%s batch %d%s cast_params %s fp32_ops %s excluded_names %s' % (
            args.model, args.batch_size,
            '' if args.pad_channels == 3 else ' pad_channels %d' % args.pad_channels,
            args.cast_params, ','.join(args.fp32_ops) or '-',
            ','.join(args.excluded_names) or '-')
    print('%s: peak RSS %.0f MiB%s; %s; stem padded in the graph: %s; losses %s' % (
        head, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, allocated,
        '%.2f img/s (median of %d steps)' % (args.batch_size / np.median(timed), len(timed))
        if timed else 'no timed steps (--steps > 2)',
        '-' if args.float32 else ','.join(padded_convolutions(mxmp.converted_graph(block)))
        or '-',
        ', '.join('%.4f' % v for v in losses)))
    return 0


def _converted(net, args, p, mxmp):
    """``mxmp.convert`` of ``net`` with the command line's options, and its mxmp.Trainer."""
    policy = mxmp.Policy('bfloat16', emulate=not mxmp.lp_kernels_available('bfloat16'),
                         fp32_ops=tuple(args.fp32_ops),
                         excluded_names=tuple(args.excluded_names))
    import mxnet as mx
    nodes = {n['name'] for n in json.loads(net(mx.sym.var('data')).tojson())['nodes']}
    block = mxmp.convert(net, cast_params=args.cast_params, policy=policy,
                         pad_stem={'on': True, 'off': False}.get(args.pad_stem, 'auto'))
    unknown = sorted(set(args.excluded_names) - nodes)
    if unknown:  # a misspelt name would silently measure the unchanged graph
        p.error('--excluded-names: no node named %s in the graph of %s (names look like '
                'resnetv10_conv0_fwd)' % (', '.join(unknown), args.model))
    trainer = mxmp.Trainer(block.collect_params(), 'sgd',
                           {'learning_rate': 0.01, 'momentum': 0.9})
    return block, trainer


def _padded(net, x, args, get_model):
    """A copy of ``net`` (initialized on the 3-channel images ``x``) whose stem convolution takes
    ``args.pad_channels`` input channels: the weights of ``net``, the stem's with zero columns."""
    import mxnet as mx
    from mxmp._src.device import to_default_layout
    net(mx.nd.array(x[:1]))  # finishes the deferred initialization with 3 channels (one
    # image: the peak RSS stays that of the training steps)
    mx.nd.waitall()
    weights = {name: prm.data().asnumpy() for name, prm in net.collect_params().items()}
    padded = get_model(args.model, pretrained=False, classes=args.classes, prefix=net.prefix)
    padded.initialize()
    shape = (1, args.pad_channels) + x.shape[2:]
    padded(mx.nd.zeros(shape))  # deferred shapes with the padded channel count
    # that inference forward left weights in oneDNN's blocked layout, into which set_data would
    # copy plain values (measured: a resnet50_v1 weight came out scrambled)
    mx.nd.waitall()  # the forward's in-place reorders are not ordered with set_data otherwise
    to_default_layout([prm.data() for prm in padded.collect_params().values()])
    stems = 0
    for name, prm in padded.collect_params().items():
        value = weights[name]
        if value.shape != prm.shape:  # the stem: (out, 3, kh, kw) -> (out, pad_channels, kh, kw)
            extra = np.zeros(value.shape[:1] + (prm.shape[1] - 3,) + value.shape[2:], 'float32')
            value, stems = np.concatenate([value, extra], axis=1), stems + 1
        prm.set_data(mx.nd.array(value))
    assert stems == 1, 'expected one stem weight with 3 input channels, found %d' % stems
    return padded


if __name__ == '__main__':
    raise SystemExit(main())
