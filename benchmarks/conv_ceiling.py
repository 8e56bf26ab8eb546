"""How fast can oneDNN's bfloat16 convolutions of ResNet-50 run at this batch, on this core?

One child process (``DNNL_VERBOSE=1``, one thread) runs, in this order:

1. mxmp's default fused bfloat16 inference of GluonCV ``resnet50_v1`` (``mxmp.convert`` +
   ``hybridize(static_alloc=True, static_shape=True)``; ``--cast-params`` for
   ``cast_params=True``; ``--input-dtype bfloat16`` feeds a bfloat16 batch, so the graph has
   no input cast; ``--fuse-inference off`` the unfused graph; ``--freeze`` the network of
   ``mxmp.freeze``), ``--calls`` timed calls after 2 warm-up calls;
2. each convolution's GEMM equivalent as a bfloat16 ``FullyConnected(x, w, no_bias=True)``
   (oneDNN's inner product, the kernel of the benchmark's peak): M = batch x output pixels,
   K = input channels x kernel taps, N = output channels, the same FLOP as the convolution
   (for a 1x1 stride-1 convolution exactly the same product; for the others the im2col GEMM,
   without the cost of building the im2col matrix);
3. the benchmark's GEMM peak (``benchmarks/peak.py``: 2048^3 bfloat16 ``FullyConnected``).

Every time is oneDNN's own (the ``exec`` lines of ``DNNL_VERBOSE``), the best of the calls
(the machine may be shared: other load can only slow a call down); wall-clock times of whole
calls are printed beside. Ratios are taken within that one process.

Run: ``python -m benchmarks.conv_ceiling --batch-size 16 --calls 5`` (about 2 minutes on
one quiet Zen 5 core). Prints a markdown table per layer (FLOP, best ms, % of the peak, the
GEMM equivalent's % of the peak) and the whole call's breakdown.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

_MARK = re.compile(r'^== (\S+) (.*)$')
_DESC = re.compile(r'mb(\d+)_g?(\d*)_?ic(\d+)oc(\d+)_ih(\d+)oh(\d+)kh(\d+)sh(\d+)\S*?_iw(\d+)'
                   r'ow(\d+)kw(\d+)sw(\d+)')


def conv_of(desc):
    """(batch, in channels, out channels, out h, out w, kh, kw, stride) of a DNNL_VERBOSE
    convolution descriptor (``mb16_ic64oc256_ih56oh56kh1sh1..._iw56ow56kw1sw1...``)."""
    m = _DESC.search(desc)
    if m is None or m.group(2):
        raise ValueError('unexpected convolution descriptor %r' % desc)
    b, _, cin, cout, _, oh, kh, sh, _, ow, kw, _ = (int(v) if v else 0 for v in m.groups())
    return b, cin, cout, oh, ow, kh, kw, sh


def gemm_of(desc):
    """(M, K, N) of the GEMM with a convolution's FLOP: M = batch x output pixels, K = input
    channels x kernel taps, N = output channels."""
    b, cin, cout, oh, ow, kh, kw, _ = conv_of(desc)
    return b * oh * ow, cin * kh * kw, cout


def child(args):
    """Runs in the DNNL_VERBOSE process: prints ``== section`` markers between the calls."""
    import mxnet as mx
    import mxmp
    from gluoncv.model_zoo import get_model
    from mxmp._src.dtypes import mx_dtype
    bf16 = mx_dtype('bfloat16')

    def mark(text):
        sys.stdout.flush()
        print('== %s' % text, flush=True)

    mx.random.seed(0)
    net = get_model('resnet50_v1', pretrained=False, classes=1000)
    net.initialize(mx.init.Xavier(magnitude=2))
    shape = (args.batch_size, 3, 224, 224)
    mxmp.convert(net, 'bfloat16', cast_params=args.cast_params,
                 fuse_inference=args.fuse_inference == 'auto' and 'auto')
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.random.uniform(-1, 1, shape=shape)
    if args.input_dtype == 'bfloat16':
        x = mx.nd.amp_cast(x, dtype=bf16)
    if args.freeze:
        net = mxmp.freeze(net, x)
    for _ in range(2):
        net(x).wait_to_read()
    for i in range(args.calls):
        mark('net %d' % i)
        start = time.perf_counter()
        net(x).wait_to_read()
        mark('wall net %d %.6f' % (i, time.perf_counter() - start))
    sys.stdout.flush()
    with open(args.log) as f:   # this process's own stdout so far: the convolutions that ran
        sections = parse(f)[0]
    gemms = sorted({gemm_of(desc) for kind, _, _, desc, _ in sections['net 0']
                    if kind == 'convolution'})
    gemms.append((2048, 2048, 2048))
    rng = np.random.RandomState(0)
    for m, k, n in gemms:
        a = mx.nd.amp_cast(mx.nd.array(rng.uniform(-1, 1, (m, k))), dtype=bf16)
        w = mx.nd.amp_cast(mx.nd.array(rng.uniform(-1, 1, (n, k))), dtype=bf16)
        mx.nd.FullyConnected(a, w, num_hidden=n, no_bias=True).wait_to_read()
        for i in range(args.calls):
            mark('gemm %d_%d_%d %d' % (m, k, n, i))
            start = time.perf_counter()
            mx.nd.FullyConnected(a, w, num_hidden=n, no_bias=True).wait_to_read()
            mark('wall gemm %d_%d_%d %d %.6f' % (m, k, n, i, time.perf_counter() - start))


def parse(lines):
    """({section: [(kind, impl, post-ops, descriptor, ms), ...]}, {wall section: seconds})."""
    sections, walls, current = collections.defaultdict(list), {}, None
    for line in lines:
        line = line.rstrip('\n')
        m = _MARK.match(line)
        if m:
            if m.group(1) == 'wall':
                *name, seconds = m.group(2).split()
                walls[' '.join(name)] = float(seconds)
                current = None
            else:
                current = '%s %s' % (m.group(1), m.group(2))
            continue
        f = line.split(',')
        if current is None or len(f) < 10 or f[0] != 'dnnl_verbose' or f[1] != 'exec':
            continue
        post = f[7].replace('attr-post-ops:', '').split(':')[0].strip() or '-'
        sections[current].append((f[3], f[4], post, f[-2], float(f[-1])))
    return sections, walls


def report(sections, walls, calls):
    """The markdown tables (str)."""
    def gemm_ms(mkn):
        return min(r[4] for i in range(calls) for r in sections['gemm %d_%d_%d %d' % (mkn + (i,))]
                   if r[0] == 'inner_product')
    peak = 2 * 2048 ** 3 / gemm_ms((2048, 2048, 2048)) / 1e6   # GFLOP/s
    peak_wall = max(2 * 2048 ** 3 / walls['gemm 2048_2048_2048 %d' % i] / 1e9
                    for i in range(calls))
    per_call = [[r for r in sections['net %d' % i] if r[0] == 'convolution']
                for i in range(calls)]
    if len({tuple(r[3] for r in c) for c in per_call}) != 1:
        raise SystemExit('the calls ran different convolutions')
    lines = ['GEMM peak (2048^3 bfloat16 FullyConnected): %.1f GFLOP/s by oneDNN exec time, '
             '%.1f by wall clock (the benchmark\'s measure)' % (peak, peak_wall), '',
             '| # | conv (execution order) | impl | post-ops | GFLOP | best ms | % of peak | '
             'GEMM (M, K, N) best ms | GEMM % of peak |', '|---|---|---|---|---|---|---|---|---|']
    totals, groups = collections.defaultdict(float), collections.defaultdict(list)
    for j, (_, impl, post, desc, _) in enumerate(per_call[0]):
        b, cin, cout, oh, ow, kh, kw, s = conv_of(desc)
        ms = min(c[j][4] for c in per_call)
        mkn = gemm_of(desc)
        flop = 2.0 * b * oh * ow * cin * kh * kw * cout
        g = gemm_ms(mkn)
        totals['flop'] += flop
        totals['ms'] += ms
        totals['gemm_ms'] += g
        totals['post ' + post] += ms
        groups['%dx%d %d->%d %dx%d s%d | %s' % (kh, kw, cin, cout, oh, ow, s, post)].append(
            (ms, flop, g))
        lines.append('| %d | %dx%d %d->%d %dx%d s%d | %s | %s | %.3f | %.2f | %.0f%% | '
                     '(%d, %d, %d) %.2f | %.0f%% |' % (
                         j, kh, kw, cin, cout, oh, ow, s, impl.split(':')[0], post,
                         flop / 1e9, ms, 100 * flop / ms / 1e6 / peak, *mkn, g,
                         100 * flop / g / 1e6 / peak))
    lines.append('| all | %d convolutions | | | %.3f | %.1f | %.0f%% | %.1f | %.0f%% |' % (
        len(per_call[0]), totals['flop'] / 1e9, totals['ms'],
        100 * totals['flop'] / totals['ms'] / 1e6 / peak, totals['gemm_ms'],
        100 * totals['flop'] / totals['gemm_ms'] / 1e6 / peak))
    lines += ['', 'By shape and post-ops (mean of the layers\' best ms):', '',
              '| conv | post-ops | layers | ms each | % of peak | GEMM equivalent % of peak |',
              '|---|---|---|---|---|---|']
    for key, rows in groups.items():
        ms, flop, g = (float(np.mean(v)) for v in zip(*rows))
        lines.append('| %s | %d | %.2f | %.0f%% | %.0f%% |' % (
            key, len(rows), ms, 100 * flop / ms / 1e6 / peak, 100 * flop / g / 1e6 / peak))
    best = min(range(calls), key=lambda i: walls['net %d' % i])
    other = collections.defaultdict(float)
    for kind, impl, _, _, ms in sections['net %d' % best]:
        other[kind if kind == 'convolution' else '%s %s' % (kind, impl)] += ms
    wall_ms = walls['net %d' % best] * 1e3
    batch = conv_of(per_call[0][0][3])[0]
    flop = totals['flop'] + 2.0 * batch * 2048 * 1000   # and the classifier
    lines += ['', 'Convolutions by post-ops (best ms summed): ' + ', '.join(
        '%s %.1f' % (k[5:], v) for k, v in sorted(totals.items()) if k.startswith('post ')),
        '', 'Fastest whole call (wall) %.1f ms = %.1f%% of the wall-clock peak (%.3f GFLOP with '
        'the classifier); its oneDNN time by primitive:' % (
            wall_ms, 100 * flop / wall_ms / 1e6 / peak_wall, flop / 1e9), '']
    for key, ms in sorted(other.items(), key=lambda kv: -kv[1]):
        lines.append('- %s: %.1f ms' % (key, ms))
    lines.append('- outside oneDNN (MXNet\'s own ops, engine, Python): %.1f ms'
                 % (wall_ms - sum(other.values())))
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--batch-size', type=int, default=16)
    p.add_argument('--calls', type=int, default=5, help='timed calls of each kind (best kept)')
    p.add_argument('--cast-params', action='store_true', help='mxmp.convert(cast_params=True)')
    p.add_argument('--fuse-inference', choices=('auto', 'off'), default='auto',
                   help="mxmp.convert's fuse_inference ('off': False)")
    p.add_argument('--freeze', action='store_true', help='run mxmp.freeze(net, batch) first')
    p.add_argument('--input-dtype', choices=('float32', 'bfloat16'), default='float32')
    p.add_argument('--log', help='keep the DNNL_VERBOSE log here')
    p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    env = dict(os.environ, DNNL_VERBOSE='1', OMP_NUM_THREADS='1', MXNET_CPU_WORKER_NSTREAMS='1')
    log = os.path.abspath(args.log or tempfile.mkstemp(suffix='.log')[1])
    argv = [a for a in (argv if argv is not None else sys.argv[1:]) if a != '--log' and
            a != args.log]
    with open(log, 'w') as out:
        subprocess.run([sys.executable, os.path.abspath(__file__), '--child', '--log', log] +
                       argv, env=env, stdout=out, check=True)
    with open(log) as f:
        sections, walls = parse(f)
    print(report(sections, walls, args.calls))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
