"""Per-operator time from MXNet's profiler, side by side for several modes.

A profiled run (see ``scripts/benchmark.py --profile``) sets ``MXNET_EXEC_BULK_EXEC_TRAIN=0``
and ``MXNET_EXEC_BULK_EXEC_INFERENCE=0`` before MXNet loads (bulked operators are timed as one
segment otherwise), warms up, then runs ``iters`` training iterations between
``mx.profiler.set_state('run')`` and ``'stop'`` with ``set_config(profile_all=True,
aggregate_stats=True)``, and keeps ``mx.profiler.dumps()``: MXNet's aggregate table. This module
parses that table and lines the modes up: operator, milliseconds per iteration in each mode, and
the ratio of the reference mode's time to each other mode's (> 1: faster than the reference).
"""
import json
import logging
import os
import re

from .flops import TRAIN_FACTOR

__all__ = ['parse_aggregate', 'per_iteration', 'side_by_side', 'markdown_table', 'run_profile',
           'gemm_layer_split', 'BULK_OFF', 'GEMM_LAYER_OPS']

LOG = logging.getLogger('benchmark')

#: Environment of a profiled process: every operator timed on its own.
BULK_OFF = {'MXNET_EXEC_BULK_EXEC_TRAIN': '0', 'MXNET_EXEC_BULK_EXEC_INFERENCE': '0'}

#: The operators whose FLOP the benchmark counts (benchmarks.flops), forward and backward, and
#: their oneDNN-fused forms (inference of a fused graph).
GEMM_LAYER_OPS = ('Convolution', '_backward_Convolution', 'FullyConnected',
                  '_backward_FullyConnected', '_sg_mkldnn_fully_connected',
                  'batch_dot', '_backward_batch_dot',
                  '_contrib_interleaved_matmul_selfatt_qk',
                  '_backward_interleaved_matmul_selfatt_qk',
                  '_contrib_interleaved_matmul_selfatt_valatt',
                  '_backward_interleaved_matmul_selfatt_valatt',
                  '_sg_mkldnn_selfatt_qk', '_sg_mkldnn_selfatt_valatt',
                  'mxmp_selfatt_qk', '_backward_mxmp_selfatt_qk',
                  'mxmp_selfatt_valatt', '_backward_mxmp_selfatt_valatt',
                  'mxmp_batch_dot', '_backward_mxmp_batch_dot')


def gemm_layer_split(per_iter, flop_per_image, batch_size, train_factor):
    """How a profiled training iteration divides between the counted layers and the rest.

    Args:
        per_iter (dict): operator -> (ms per iteration, calls), from :func:`per_iteration`.
        flop_per_image (float): forward FLOP of one image (benchmarks.flops).
        batch_size (int): images per iteration.
        train_factor (int): training FLOP / forward FLOP (benchmarks.flops.TRAIN_FACTOR).

    Returns:
        dict: ``gemm_ms`` (time of :data:`GEMM_LAYER_OPS`), ``other_ms`` (every other
        operator), ``gemm_gflops`` (the iteration's FLOP over ``gemm_ms``: the speed of the
        convolutions and fully-connected layers themselves, in GFLOP/s) and
        ``all_gflops`` (the same FLOP over all operator time), or None when no counted
        operator ran or the FLOP is unknown.
    """
    gemm = sum(per_iter[op][0] for op in GEMM_LAYER_OPS if op in per_iter)
    total = sum(ms for ms, _ in per_iter.values())
    if not gemm or not flop_per_image:
        return None
    flop = float(flop_per_image) * batch_size * train_factor
    return {'gemm_ms': gemm, 'other_ms': total - gemm, 'gemm_gflops': flop / gemm / 1e6,
            'all_gflops': flop / total / 1e6}

_ROW = re.compile(r'^(?P<name>\S.*?)\s+(?P<count>\d+)\s+(?P<total>-?[\d.]+)\s+(?P<min>-?[\d.]+)'
                  r'\s+(?P<max>-?[\d.]+)\s+(?P<avg>-?[\d.]+)\s*$')
# 'Device Storage' rows: count, min, max, avg use (kB), no total
_STORAGE_ROW = re.compile(r'^(?P<name>\S.*?)\s+(?P<count>\d+)\s+(?P<min>-?[\d.]+)'
                          r'\s+(?P<max>-?[\d.]+)\s+(?P<avg>-?[\d.]+)\s*$')


def parse_aggregate(text):
    """Parse ``mx.profiler.dumps()`` (MXNet 1.9.1's aggregate statistics) into dicts.

    Args:
        text (str): the dump.

    Returns:
        dict: section name (``'operator'``, ``'MXNET_C_API'``, ``'Device Storage'``, ...) ->
        {row name -> {'count': int, 'total_ms', 'min_ms', 'max_ms', 'avg_ms': float}}.
        For 'Device Storage' (count, min, max and average use; no total) the numbers are kB
        (the table's own unit), under the same keys, with ``total_ms`` None.

    Raises:
        ValueError: no section found (not a profiler dump, or aggregate_stats was off).
    """
    lines = text.splitlines()
    sections, current = {}, None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and set(lines[i + 1].strip()) == {'='} and line.strip():
            current = sections.setdefault(line.strip(), {})
            continue
        if current is None or set(line.strip()) <= {'=', '-', ' '} or line.startswith('Name'):
            continue
        m = _ROW.match(line.strip()) or _STORAGE_ROW.match(line.strip())
        if m:
            current[m.group('name')] = {
                'count': int(m.group('count')),
                'total_ms': float(m.group('total')) if 'total' in m.groupdict() else None,
                'min_ms': float(m.group('min')), 'max_ms': float(m.group('max')),
                'avg_ms': float(m.group('avg'))}
    if not sections:
        raise ValueError('no profiler section found: expected the text of mx.profiler.dumps() '
                         'after set_config(aggregate_stats=True)')
    return sections


def per_iteration(sections, iters, section='operator'):
    """{operator -> (ms per iteration, calls per iteration)} of one parsed dump."""
    return {name: (row['total_ms'] / iters, row['count'] / iters)
            for name, row in sections.get(section, {}).items()}


def side_by_side(profiles, reference):
    """Rows of operator times across modes, largest total first.

    Args:
        profiles (dict): mode -> {operator -> (ms per iteration, calls per iteration)}.
        reference (str): the mode the ratios are taken against (e.g. ``'float32'``).

    Returns:
        list of dict: ``{'op', 'ms': {mode: float or None}, 'calls': {mode: float or None},
        'ratio': {mode: reference ms / mode ms, or None}}``, sorted by the largest time of the
        row in any mode, then by name; a last row ``op='total'`` sums each mode.
    """
    ops = sorted({op for p in profiles.values() for op in p})
    rows = []
    for op in ops:
        ms = {m: p[op][0] if op in p else None for m, p in profiles.items()}
        calls = {m: p[op][1] if op in p else None for m, p in profiles.items()}
        rows.append({'op': op, 'ms': ms, 'calls': calls})
    rows.sort(key=lambda r: (-max(v or 0 for v in r['ms'].values()), r['op']))
    total = {m: sum(v for v, _ in p.values()) for m, p in profiles.items()}
    rows.append({'op': 'total', 'ms': total, 'calls': {m: None for m in profiles}})
    for r in rows:
        ref = r['ms'].get(reference)
        r['ratio'] = {m: (ref / v if ref and v else None) for m, v in r['ms'].items()}
    return rows


def markdown_table(rows, labels, reference, limit=None):
    """A Markdown table of :func:`side_by_side` rows.

    Args:
        rows (list of dict): from :func:`side_by_side`.
        labels (dict): mode -> column label, in column order.
        reference (str): the reference mode (its ratio column is left out).
        limit (int): at most this many operator rows (the total row is always kept).
    """
    modes = list(labels)
    others = [m for m in modes if m != reference]
    head = ['op'] + ['%s ms/iter' % labels[m] for m in modes] + \
        ['%s / %s' % (labels[reference], labels[m]) for m in others]
    out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    body = [r for r in rows if r['op'] != 'total']
    if limit is not None:
        body = body[:limit]
    for r in body + [r for r in rows if r['op'] == 'total']:
        cells = [r['op']] + ['-' if r['ms'][m] is None else '%.2f' % r['ms'][m] for m in modes]
        cells += ['-' if r['ratio'][m] is None else '%.2fx' % r['ratio'][m] for m in others]
        out.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(out) + '\n'


def run_profile(config, env, machine, out_dir, timeout, run_child, mode_label, modes):
    """``scripts/benchmark.py --profile``: one profiled process per mode, training or inference
    (``config['profile_phase']``, default ``'train'``).

    Args:
        config (dict): the benchmark configuration (model, batch_size, dtype, warmup, iters,
            profile_phase...).
        env (dict): the environment of the processes (bulk execution is turned off on top).
        machine (dict): machine info (threads, loadavg_start; loadavg_end is set here).
        out_dir (str): where ``profile.md``, ``profile.json`` and the raw dumps go.
        timeout (float): seconds per process.
        run_child (callable): ``run_child(spec, env, log_path, result_path, timeout)`` -> result.
        mode_label (callable): ``mode_label(mode, dtype, emulated)`` -> str.
        modes (sequence of str): the modes; the first is the reference of the ratios.

    Returns:
        int: 0 when at least one mode was profiled, else 1. The table is printed.
    """
    env = dict(env, **BULK_OFF)
    batch = config['batch_size'][0]
    phase = config.get('profile_phase') or 'train'
    factor = TRAIN_FACTOR if phase == 'train' else 1
    per_mode, labels, results = {}, {}, {}
    for mode in modes:
        spec = dict(config, mode=mode, phase=phase, batch_size=batch, output_dir=out_dir,
                    profile=True)
        name = 'profile_%s_bs%d_%s' % (phase, batch, mode)
        res = run_child(spec, env, os.path.join(out_dir, 'logs', name + '.log'),
                        os.path.join(out_dir, 'logs', name + '.json'), timeout)
        label = mode_label(mode, config['dtype'], res.get('emulated'))
        results[mode] = {k: v for k, v in res.items() if k != 'profile_text'}
        if res['status'] != 'ok':
            LOG.warning('profile %s FAILED: %s', mode, res.get('error'))
            results[mode]['label'] = label
            continue
        with open(os.path.join(out_dir, name + '.txt'), 'w') as f:
            f.write(res['profile_text'])
        sections = parse_aggregate(res['profile_text'])
        per_mode[mode] = per_iteration(sections, res['profile_iters'])
        labels[mode] = results[mode]['label'] = label
        LOG.info('profile %s: %.1f ms per iteration', mode, 1000 * res['iter_s'][0])
    machine['loadavg_end'] = os.getloadavg()
    from benchmarks.workloads import shape_label
    shape = shape_label(config)
    lines = ['# mxmp %s profile: %s, %s, batch %d, target dtype %s'
             % ('training' if phase == 'train' else 'inference', config['model'], shape, batch,
                config['dtype']), '',
             '- command: `%s`' % config['command'],
             '- %s threads; bulk execution off (%s); load average %.1f at start, %.1f at end'
             % (machine['threads'], ', '.join('%s=%s' % kv for kv in
                                              BULK_OFF.items()),
                machine['loadavg_start'][0], machine['loadavg_end'][0]),
             '- %d warm-up + %d profiled iterations per mode, one fresh process per mode'
             % (config['warmup'], config['iters'])]
    for mode, r in results.items():
        lines.append('- %s: %s' % (r['label'], '%.1f ms per profiled iteration (wall, with '
                                   'the profiler on)' % (1000 * r['iter_s'][0])
                                   if r['status'] == 'ok' else 'FAILED: %s' % r.get('error')))
        split = gemm_layer_split(per_mode[mode], r.get('flop_per_image'), batch,
                                 factor) if mode in per_mode else None
        if split:
            r['gemm_layer_split'] = split
            lines.append('  - convolutions and fully-connected layers (and matrix products)%s: '
                         '%.1f ms, %.1f GFLOP/s; every other operator: %.1f ms (%.0f%% of the '
                         'operator time); all operators: %.1f GFLOP/s%s'
                         % (' (forward and backward)' if phase == 'train' else '',
                            split['gemm_ms'], split['gemm_gflops'], split['other_ms'],
                            100 * split['other_ms'] / (split['gemm_ms'] + split['other_ms']),
                            split['all_gflops'], ' (training FLOP = %d x forward)' % factor
                            if phase == 'train' else ''))
    rows = []
    if per_mode:
        reference = next(m for m in modes if m in per_mode)
        rows = side_by_side(per_mode, reference)
        lines += ['', 'Operator time in ms per iteration (sum over the calls of the iteration); '
                  'ratio columns: the %s time divided by the mode\'s (> 1: faster than %s).'
                  % (labels[reference], labels[reference]), '',
                  markdown_table(rows, labels, reference)]
    text = '\n'.join(lines) + '\n'
    report = {'config': config, 'machine': machine, 'modes': results, 'rows': rows}
    with open(os.path.join(out_dir, 'profile.json'), 'w') as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out_dir, 'profile.md'), 'w') as f:
        f.write(text)
    print(text)
    LOG.info('wrote %s', os.path.join(out_dir, 'profile.md'))
    return 0 if per_mode else 1
