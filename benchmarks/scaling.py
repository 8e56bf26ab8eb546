"""Scaling with threads: ``scripts/benchmark.py --threads 1 2 ...`` runs the whole benchmark (or
``--profile``) once per thread count, each in ``OUTPUT_DIR/threads<N>/``, then lines the counts
up here.

* Benchmark: per phase, batch and mode, the median throughput at each count, its speed-up from
  the first count (throughput at N / throughput at the first), and the mode's speed against
  float32 at each count (``speedup_vs_float32`` of the run: > 1 faster than float32).
* Profile: per mode and operator, ms per iteration at each count and the speed-up from the first
  count (ms at the first / ms at N: 2.0 is perfect scaling from 1 to 2 threads).

Written to ``OUTPUT_DIR/scaling.json`` and ``scaling.md`` and printed.
"""
import json
import os

__all__ = ['benchmark_rows', 'profile_rows', 'markdown', 'write']


def _speedup(first, now):
    return first / now if first and now else None


def benchmark_rows(reports):
    """Rows of the benchmark at several thread counts.

    Args:
        reports (dict): thread count -> the ``benchmark.json`` report of that count.

    Returns:
        list of dict: ``{'phase', 'batch_size', 'mode', 'label', 'per_s': {n: median or None},
        'scaling': {n: per_s[n] / per_s[first] or None}, 'vs_float32': {n: float or None}}``,
        in the order of the first count's rows.
    """
    counts = sorted(reports)
    keyed = {n: {(r['phase'], r['batch_size'], r['mode']): r for r in reports[n]['rows']}
             for n in counts}
    out = []
    for key, first in keyed[counts[0]].items():
        rows = {n: keyed[n].get(key, {}) for n in counts}
        per_s = {n: rows[n].get('img_per_s_median') for n in counts}
        out.append({'phase': key[0], 'batch_size': key[1], 'mode': key[2],
                    'label': first.get('label', key[2]), 'per_s': per_s,
                    'scaling': {n: _speedup(per_s[n], per_s[counts[0]]) for n in counts},
                    'vs_float32': {n: rows[n].get('speedup_vs_float32') for n in counts}})
    return out


def profile_rows(reports):
    """Rows of the profile at several thread counts.

    Args:
        reports (dict): thread count -> the ``profile.json`` report of that count.

    Returns:
        list of dict: ``{'mode', 'op', 'ms': {n: ms per iteration or None},
        'speedup': {n: ms[first] / ms[n] or None}}``, per mode the operators by their time at
        the first count (largest first), the ``total`` row last.
    """
    counts = sorted(reports)
    table = {n: {(mode, r['op']): r['ms'].get(mode) for r in reports[n]['rows']
                 for mode in r['ms']} for n in counts}
    modes = list(reports[counts[0]]['modes'])
    out = []
    for mode in modes:
        ops = sorted({op for n in counts for m, op in table[n] if m == mode and op != 'total'},
                     key=lambda op: (-(table[counts[0]].get((mode, op)) or 0), op))
        for op in ops + ['total']:
            ms = {n: table[n].get((mode, op)) for n in counts}
            if all(v is None for v in ms.values()):
                continue
            out.append({'mode': mode, 'op': op, 'ms': ms,
                        'speedup': {n: _speedup(ms[counts[0]], ms[n]) for n in counts}})
    return out


def _f(value, spec):
    return '-' if value is None else spec % value


def markdown(kind, rows, counts, unit='img', limit=None):
    """The Markdown table of :func:`benchmark_rows` (``kind='benchmark'``) or
    :func:`profile_rows` (``kind='profile'``) rows; ``limit`` operators per mode at most
    (profile; the total row is always kept)."""
    first, later = counts[0], counts[1:]
    if kind == 'benchmark':
        head = (['phase', 'batch', 'mode'] + ['%s/s at %d' % (unit, n) for n in counts] +
                ['speed-up %d->%d' % (first, n) for n in later] +
                ['x float32 at %d' % n for n in counts])
        body = [[r['phase'], str(r['batch_size']), r['label']] +
                [_f(r['per_s'][n], '%.2f') for n in counts] +
                [_f(r['scaling'][n], '%.2fx') for n in later] +
                [_f(r['vs_float32'][n], '%.2fx') for n in counts] for r in rows]
    else:
        head = (['mode', 'op'] + ['ms/iter at %d' % n for n in counts] +
                ['speed-up %d->%d' % (first, n) for n in later])
        body, shown = [], {}
        for r in rows:
            shown[r['mode']] = shown.get(r['mode'], 0) + 1
            if limit is not None and r['op'] != 'total' and shown[r['mode']] > limit:
                continue
            body.append([r['mode'], r['op']] + [_f(r['ms'][n], '%.2f') for n in counts] +
                        [_f(r['speedup'][n], '%.2fx') for n in later])
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    return '\n'.join(lines + ['| ' + ' | '.join(b) + ' |' for b in body]) + '\n'


def write(kind, reports, out_dir, command, unit='img', limit=25):
    """Line up the per-count reports, write ``scaling.json``/``scaling.md`` in ``out_dir`` and
    return the Markdown text.

    Args:
        kind (str): ``'benchmark'`` or ``'profile'``.
        reports (dict): thread count -> that count's JSON report.
        out_dir (str): the run's output directory (the counts' are below it).
        command (str): the command line, recorded.
        unit (str): the benchmark's throughput unit (``img``, ``seq``, ``sent``).
        limit (int): operators per mode in the printed profile table (the JSON has all).
    """
    counts = sorted(reports)
    rows = benchmark_rows(reports) if kind == 'benchmark' else profile_rows(reports)
    what = ('speed against float32 at each thread count, and each mode\'s speed-up from %d '
            'thread(s)' % counts[0] if kind == 'benchmark' else
            'each operator\'s speed-up from %d thread(s) (ms at %d / ms at N; the operators '
            'of each mode by their time at %d, at most %d per mode here, all in scaling.json)'
            % (counts[0], counts[0], counts[0], limit))
    loads = ', '.join('%d threads: %.1f-%.1f' % (n, reports[n]['machine']['loadavg_start'][0],
                                                 reports[n]['machine'].get(
                                                     'loadavg_end', [float('nan')])[0])
                      for n in counts)
    text = '\n'.join([
        '# Scaling with threads (%s): %s' % (kind, ', '.join(str(n) for n in counts)), '',
        '- command: `%s`' % command,
        '- one full run per count in threads<N>/; load average at start-end: %s' % loads,
        '- %s' % what, '',
        markdown(kind, rows, counts, unit, limit if kind == 'profile' else None)])
    with open(os.path.join(out_dir, 'scaling.json'), 'w') as f:
        json.dump({'kind': kind, 'threads': counts, 'command': command, 'rows': rows}, f,
                  indent=1)
    with open(os.path.join(out_dir, 'scaling.md'), 'w') as f:
        f.write(text)
    return text
