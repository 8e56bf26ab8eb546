"""Where a training step's oneDNN time goes: a DNNL_VERBOSE=1 log summed by primitive.

``DNNL_VERBOSE=1 MXNET_EXEC_BULK_EXEC_TRAIN=0 OMP_NUM_THREADS=1 python -m benchmarks.train_rss
--steps 3 --mark-phases > log.txt`` then ``python -m benchmarks.dnnl_verbose log.txt --step 2``
prints, for each phase of that step (forward, backward, update: the lines before the
``== step N phase`` marker ``--mark-phases`` prints), the oneDNN primitive executions summed by
(kind, implementation, propagation, and for element-wise kinds the memory formats), largest
first: milliseconds, calls. Convolutions and inner products are counted without their formats
(one row per kernel and direction). Only oneDNN's own work is in the log: operators MXNet runs
itself (e.g. the optimizer update) are not.
"""
import argparse
import collections
import re

__all__ = ['summarize', 'main']

_MARK = re.compile(r'^== step (\d+) (\w+)$')
_GEMM_KINDS = ('convolution', 'deconvolution', 'inner_product', 'matmul')


def summarize(lines):
    """Sum the ``exec`` lines of a DNNL_VERBOSE log per phase and per primitive.

    Args:
        lines (iterable of str): the log, with ``== step N phase`` marker lines.

    Returns:
        dict: ``(step, phase)`` -> {(kind, implementation, prop_kind, formats): [calls, ms]},
        for the exec lines before each marker (and after the previous one). ``formats`` is ''
        for convolutions, deconvolutions, inner products and matmuls.
    """
    out, current = {}, collections.defaultdict(lambda: [0, 0.0])
    for line in lines:
        line = line.strip()
        m = _MARK.match(line)
        if m:
            out[(int(m.group(1)), m.group(2))] = dict(current)
            current = collections.defaultdict(lambda: [0, 0.0])
            continue
        fields = line.split(',')
        if len(fields) < 10 or not fields[0].endswith('_verbose') or fields[1] != 'exec':
            continue
        kind, impl, prop, formats = fields[3], fields[4], fields[5], fields[6]
        key = (kind, impl, prop, '' if kind in _GEMM_KINDS else formats)
        current[key][0] += 1
        current[key][1] += float(fields[-1])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('log', help='DNNL_VERBOSE=1 output of benchmarks.train_rss --mark-phases')
    p.add_argument('--step', type=int, default=2, help='which step (0-based; default 2: the '
                   'first ones create primitives)')
    p.add_argument('--top', type=int, default=15, help='rows per phase')
    args = p.parse_args(argv)
    with open(args.log) as f:
        phases = summarize(f)
    found = [(s, ph) for s, ph in phases if s == args.step]
    if not found:
        p.error('no "== step %d ..." marker in %s: run benchmarks.train_rss with --mark-phases '
                'and --steps > %d' % (args.step, args.log, args.step))
    for key in found:
        rows = sorted(phases[key].items(), key=lambda kv: -kv[1][1])
        total = sum(ms for _, ms in phases[key].values())
        gemm = sum(ms for k, (_, ms) in phases[key].items() if k[0] in _GEMM_KINDS)
        print('step %d %s: oneDNN %.1f ms, of which convolutions/inner products %.1f ms' % (
            key[0], key[1], total, gemm))
        for (kind, impl, prop, formats), (calls, ms) in rows[:args.top]:
            print('  %8.1f ms %4d x %s %s %s %s' % (ms, calls, kind, impl, prop, formats))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
