"""Scaling with threads: ``scripts/benchmark.py --threads 1 2 ...`` runs the whole benchmark (or
``--profile``) once per thread count, each in ``OUTPUT_DIR/threads<N>/``, then lines the counts
up here.

* Benchmark: per phase, batch and mode, the median throughput at each count, the time of one
  batch (``--phases infer --batch-size 1``: the latency of one call), its speed-up from
  the first count (throughput at N / throughput at the first), and the mode's speed against
  float32 at each count (``speedup_vs_float32`` of the run: > 1 faster than float32).
* Profile: per mode and operator, ms per iteration at each count and the speed-up from the first
  count (ms at the first / ms at N: 2.0 is perfect scaling from 1 to 2 threads).

Written to ``OUTPUT_DIR/scaling.json`` and ``scaling.md`` and printed.

* Projection (``python -m benchmarks.scaling PROFILE... --project 8 16 32 64``, the profile
  reports of two or more thread counts, ``OUTPUT_DIR/threads<N>/profile.json`` or the
  ``OUTPUT_DIR`` of a ``--profile --threads`` run): each operator's serial fraction ``s``
  (Amdahl's law, ``t(n) = t(1) * (s + (1 - s) / n)``) from its time at the lowest and the
  highest measured count, clipped to [0, 1], then each mode's iteration time at the projected
  counts as the sum over its operators, plus the part of the iteration outside every operator
  (wall time with the profiler on minus the operators' sum: host code, engine gaps) projected
  the same way; and each mode's speed against the first mode (float32) at each count.
  Assumptions: each operator keeps the serial fraction measured between the two counts (a loaded
  machine inflates it: a pessimistic projection), memory bandwidth grows with the cores, no
  NUMA, the same shapes; see :func:`project`.
"""
import argparse
import glob
import json
import os
import sys

__all__ = ['benchmark_rows', 'profile_rows', 'markdown', 'write', 'serial_fraction',
           'amdahl_time', 'project', 'projection_markdown', 'projection_text', 'load_profiles',
           'main', 'PROJECT_TO']

#: Thread counts ``scripts/benchmark.py --profile --threads ...`` projects to.
PROJECT_TO = (8, 16, 32, 64)
#: The pseudo-operator of :func:`project`: wall time per iteration minus the operators' sum.
OUTSIDE = '(outside operators)'


def _speedup(first, now):
    return first / now if first and now else None


def benchmark_rows(reports):
    """Rows of the benchmark at several thread counts.

    Args:
        reports (dict): thread count -> the ``benchmark.json`` report of that count.

    Returns:
        list of dict: ``{'phase', 'batch_size', 'mode', 'label', 'per_s': {n: median or None},
        'ms': {n: 1000 * batch_size / per_s[n] or None}, 'scaling': {n: per_s[n] /
        per_s[first] or None}, 'vs_float32': {n: float or None}}``, in the order of the first
        count's rows. ``ms`` is the median time of one iteration (one batch): at batch 1 in
        the inference phase, the latency of one call.
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
                    'ms': {n: 1000.0 * key[1] / per_s[n] if per_s[n] else None
                           for n in counts},
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
                ['ms/batch at %d' % n for n in counts] +
                ['speed-up %d->%d' % (first, n) for n in later] +
                ['x float32 at %d' % n for n in counts])
        body = [[r['phase'], str(r['batch_size']), r['label']] +
                [_f(r['per_s'][n], '%.2f') for n in counts] +
                [_f(r['ms'][n], '%.1f') for n in counts] +
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


# ---------------------------------------------------------------------------------- projection
def serial_fraction(t_a, t_b, n_a, n_b):
    """Amdahl's serial fraction ``s`` of an operator timed at two thread counts.

    With ``t(n) = t1 * (s + (1 - s) / n)``, two measurements give
    ``s = (1/n_b - r/n_a) / (r * (1 - 1/n_a) - (1 - 1/n_b))`` with ``r = t_b / t_a``; from
    ``n_a = 1``, ``s = (r - 1/n_b) / (1 - 1/n_b)``, and from 1 to 2 threads ``s = 2 r - 1``.

    Args:
        t_a, t_b (float): time at ``n_a`` and at ``n_b`` threads (any unit, > 0).
        n_a, n_b (int): the thread counts, ``n_a < n_b``.

    Returns:
        float: ``s`` clipped to [0, 1] (a speed-up above linear gives 0, a slow-down 1).

    Raises:
        ValueError: times not positive, or counts not increasing.
    """
    if not (t_a > 0 and t_b > 0):
        raise ValueError('serial_fraction needs positive times, got %r and %r' % (t_a, t_b))
    if not 1 <= n_a < n_b:
        raise ValueError('serial_fraction needs thread counts 1 <= n_a < n_b, got %r and %r'
                         % (n_a, n_b))
    r = float(t_b) / t_a
    a, b = 1.0 / n_a, 1.0 / n_b
    s = (b - r * a) / (r * (1 - a) - (1 - b))
    return min(1.0, max(0.0, s))


def amdahl_time(t_a, n_a, s, n):
    """Time at ``n`` threads of an operator that took ``t_a`` at ``n_a`` threads and has serial
    fraction ``s`` (Amdahl's law): ``t_a * (s + (1 - s) / n) / (s + (1 - s) / n_a)``."""
    return t_a * (s + (1 - s) / float(n)) / (s + (1 - s) / float(n_a))


def _mode_ops(report, mode):
    """{operator -> ms per iteration} of ``mode`` in a profile report, with :data:`OUTSIDE`."""
    ops = {r['op']: r['ms'][mode] for r in report['rows']
           if r['op'] != 'total' and r['ms'].get(mode)}
    wall = report['modes'].get(mode, {}).get('iter_s')
    if ops and wall:
        ops[OUTSIDE] = max(0.0, 1000.0 * wall[0] - sum(ops.values()))
    return ops


def project(reports, counts):
    """Project each mode's iteration time to other thread counts, operator by operator.

    Args:
        reports (dict): thread count -> the ``profile.json`` report of that count (at least
            two counts; the lowest, ``n_a``, and the highest, ``n_b``, are used).
        counts (list of int): the thread counts to project to.

    Returns:
        dict: ``{'measured': [n_a, n_b], 'counts': counts, 'reference': first mode,
        'modes': {mode: {'ms': {n: projected ms per iteration}, 'measured_ms': {n_a: ms,
        n_b: ms}, 'vs_reference': {n: reference ms / mode ms}, 'ops': [{'op', 'ms_a',
        'ms_b', 's', 'ms': {n: ms}}, ...]}}}``. The ops of a mode are those timed at both
        counts (and :data:`OUTSIDE`), largest projected time at the largest count first; an
        op timed at one count only, or at 0 ms at one, is left out and named in
        ``'unmatched'``. ``ms`` at a
        count that was measured is the Amdahl fit, equal to the measurement at ``n_a`` and
        ``n_b``.

    Raises:
        ValueError: fewer than two thread counts, or no mode profiled at both.
    """
    measured = sorted(reports)
    if len(measured) < 2:
        raise ValueError('a projection needs profiles at two thread counts or more, got %s'
                         % measured)
    n_a, n_b = measured[0], measured[-1]
    ra, rb = reports[n_a], reports[n_b]
    modes = [m for m in ra['modes'] if m in rb['modes'] and _mode_ops(ra, m) and
             _mode_ops(rb, m)]
    if not modes:
        raise ValueError('no mode was profiled at both %d and %d threads' % (n_a, n_b))
    out = {'measured': [n_a, n_b], 'counts': list(counts), 'reference': modes[0], 'modes': {}}
    for mode in modes:
        ops_a, ops_b = _mode_ops(ra, mode), _mode_ops(rb, mode)
        rows, left_out = [], set(ops_a) ^ set(ops_b)
        for op in sorted(set(ops_a) & set(ops_b)):
            ta, tb = ops_a[op], ops_b[op]
            if not (ta > 0 and tb > 0):
                left_out.add(op)
                continue
            s = serial_fraction(ta, tb, n_a, n_b)
            rows.append({'op': op, 'ms_a': ta, 'ms_b': tb, 's': s,
                         'ms': {n: amdahl_time(ta, n_a, s, n) for n in counts}})
        last = counts[-1] if counts else n_b
        rows.sort(key=lambda r: (-r['ms'].get(last, r['ms_b']), r['op']))
        out['modes'][mode] = {
            'label': ra['modes'][mode].get('label', mode), 'ops': rows,
            'unmatched': sorted(left_out),
            'measured_ms': {n_a: sum(r['ms_a'] for r in rows), n_b: sum(r['ms_b'] for r in rows)},
            'ms': {n: sum(r['ms'][n] for r in rows) for n in counts}}
    ref = out['modes'][modes[0]]
    for mode, m in out['modes'].items():
        m['vs_reference'] = {n: ref['ms'][n] / m['ms'][n] if m['ms'][n] else None
                             for n in counts}
        m['measured_vs_reference'] = {n: ref['measured_ms'][n] / m['measured_ms'][n]
                                      for n in (n_a, n_b)}
    return out


def projection_markdown(proj, top=10):
    """The Markdown of :func:`project`: one table of the modes (measured and projected ms per
    iteration and speed against the reference) and per mode its ``top`` operators at the
    largest projected count, with their serial fractions."""
    n_a, n_b = proj['measured']
    counts = proj['counts']
    ref = proj['modes'][proj['reference']]['label']
    head = (['mode', 'ms at %d (measured)' % n_a, 'ms at %d (measured)' % n_b] +
            ['ms at %d' % n for n in counts] +
            ['x %s at %d (measured)' % (ref, n_a), 'x %s at %d (measured)' % (ref, n_b)] +
            ['x %s at %d' % (ref, n) for n in counts])
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for m in proj['modes'].values():
        lines.append('| ' + ' | '.join(
            [m['label'], '%.1f' % m['measured_ms'][n_a], '%.1f' % m['measured_ms'][n_b]] +
            ['%.1f' % m['ms'][n] for n in counts] +
            ['%.2fx' % m['measured_vs_reference'][n] for n in (n_a, n_b)] +
            [_f(m['vs_reference'][n], '%.2fx') for n in counts]) + ' |')
    for m in proj['modes'].values():
        last = counts[-1] if counts else None
        lines += ['', '%s: the %d operators with the most time%s (s: serial fraction)'
                  % (m['label'], top, ' at %d threads' % last if last else ''), '',
                  '| op | ms at %d | ms at %d | speed-up | s |' % (n_a, n_b) +
                  ''.join(' ms at %d |' % n for n in counts) +
                  ''.join(' share at %d |' % n for n in counts),
                  '|' + '---|' * (5 + 2 * len(counts))]
        for r in m['ops'][:top]:
            lines.append('| %s | %.2f | %.2f | %.2fx | %.2f |' % (
                r['op'], r['ms_a'], r['ms_b'], r['ms_a'] / r['ms_b'], r['s']) +
                ''.join(' %.2f |' % r['ms'][n] for n in counts) +
                ''.join(' %.0f%% |' % (100 * r['ms'][n] / m['ms'][n]) for n in counts))
        if m['unmatched']:
            lines += ['', 'Profiled at one count only or at 0 ms (left out): %s'
                      % ', '.join(m['unmatched'])]
    return '\n'.join(lines) + '\n'


def load_profiles(paths):
    """{thread count -> profile report} from ``profile.json`` files or the output directories
    of ``scripts/benchmark.py --profile --threads ...`` (their ``threads<N>/profile.json``).

    Raises:
        ValueError: a path that is neither, two reports of one count, or a report that is not
        a profile.
    """
    files = []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, 'threads*', 'profile.json')))
            if not found and os.path.exists(os.path.join(path, 'profile.json')):
                found = [os.path.join(path, 'profile.json')]
            if not found:
                raise ValueError('%s: no profile.json nor threads<N>/profile.json in it; give '
                                 'the --output-dir of scripts/benchmark.py --profile' % path)
            files += found
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise ValueError('%s: no such file or directory' % path)
    reports = {}
    for path in files:
        with open(path) as f:
            report = json.load(f)
        if 'modes' not in report or 'rows' not in report or 'machine' not in report:
            raise ValueError('%s is not a profile report of scripts/benchmark.py --profile'
                             % path)
        n = int(report['machine']['threads'])
        if n in reports:
            raise ValueError('two profiles at %d threads (%s): give one per count' % (n, path))
        reports[n] = report
    return reports


def projection_text(reports, proj, top=10):
    """The Markdown page of a projection: its title, the profiles' command and load averages,
    the method and assumptions, then :func:`projection_markdown`.

    Args:
        reports (dict): thread count -> profile report (what :func:`project` read).
        proj (dict): :func:`project`'s result.
        top (int): operators listed per mode.
    """
    loads = ', '.join('%d threads: load %.1f-%.1f' % (
        n, r['machine']['loadavg_start'][0], r['machine'].get('loadavg_end', [float('nan')])[0])
        for n, r in sorted(reports.items()))
    return '\n'.join([
        '# Projected with Amdahl\'s law from %d and %d threads' % tuple(proj['measured']), '',
        '- profiles of `%s` (%s)' % (reports[proj['measured'][0]]['config'].get('command', '?'),
                                     loads),
        '- per operator s = serial fraction from its times at %d and %d threads, clipped to '
        '[0, 1]; %s = wall time with the profiler on minus the operators\' sum'
        % (proj['measured'][0], proj['measured'][1], OUTSIDE),
        '- assumes: the same serial fraction at every count, memory bandwidth growing with the '
        'cores, no NUMA, no other load; a loaded profile gives a meaningless fit',
        '', projection_markdown(proj, top)])


def main(argv=None):
    """``python -m benchmarks.scaling PROFILE... --project 8 16 32 64``: print the projection
    (and write it as JSON with ``--output``); exit code 2 on bad input."""
    p = argparse.ArgumentParser(
        prog='python -m benchmarks.scaling',
        description='Project each mode\'s training (or inference) iteration time to more '
                    'threads from the per-operator profiles of scripts/benchmark.py --profile '
                    '--threads N1 N2: Amdahl\'s law per operator, its serial fraction measured '
                    'between the lowest and highest count.')
    p.add_argument('profiles', nargs='+', help='profile.json files, or --output-dir '
                   'directories of a --profile --threads run')
    p.add_argument('--project', type=int, nargs='+', required=True, metavar='N',
                   help='thread counts to project to, e.g. 8 16 32 64')
    p.add_argument('--top', type=int, default=10, help='operators listed per mode')
    p.add_argument('--output', help='also write the projection as JSON here')
    args = p.parse_args(argv)
    try:
        if min(args.project) < 1:
            raise ValueError('--project: thread counts must be >= 1')
        reports = load_profiles(args.profiles)
        proj = project(reports, sorted(set(args.project)))
    except ValueError as err:
        print('error: %s' % err, file=sys.stderr)
        return 2
    print(projection_text(reports, proj, args.top))
    if args.output:
        with open(args.output, 'w') as f:
            json.dump(proj, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
