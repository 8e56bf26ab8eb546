"""The benchmark's Markdown report: configuration, one table of every row, the memory split,
the loss check and the legend."""
from benchmarks import flops as bench_flops
from benchmarks import memory as bench_memory
from benchmarks import peak as bench_peak
from benchmarks.modes import LEARNING_RATE, MOMENTUM, mode_label


def _fmt(value, spec='%.2f', none='-'):
    return none if value is None else spec % value


def _casts(c):
    return '-' if not c else '%d / %d' % (c['amp_cast'], c['amp_multicast'])


def markdown(report):
    """The Markdown report: configuration, one table of every row, the loss check."""
    cfg, mach = report['config'], report['machine']
    lines = ['# mxmp benchmark: %s, input %dx%d, target dtype %s, %s'
             % (cfg['model'], cfg['input_size'], cfg['input_size'], cfg['dtype'], cfg['ctx']), '',
             '- command: `%s`' % cfg['command'],
             '- machine: %s, %s cores, AVX-512 flags: %s; %s threads (OMP_NUM_THREADS); load '
             'average %.1f at start, %.1f at end'
             % (mach.get('cpu_model'), mach['cpus'], ', '.join(mach.get('avx512_flags') or [])
                or 'none', mach['threads'], mach['loadavg_start'][0], mach['loadavg_end'][0]),
             '- %s kernels on this device (mxmp.lp_kernels_available): %s'
             % (cfg['dtype'], report.get('lp_kernels_available')),
             '- %d warm-up + %d timed iterations per run, %d interleaved repeat(s), one fresh '
             'process per run; total %.0f s' % (cfg['warmup'], cfg['iters'], cfg['repeats'],
                                               report['total_s']), '']
    if any(r.get('emulated') for r in report['rows']):
        lines += ['**Rows marked (emulated) run float32 kernels with %s rounding: they measure '
                  'numerics and the cost of emulation, not %s speed.**' % (cfg['dtype'],
                                                                          cfg['dtype']), '']
    lines += bench_peak.limit_markdown(report.get('peaks') or {}, cfg['dtype'],
                                       report['machine']['threads'])
    head = ('| phase | batch | mode | status | img/s median | min | max | GFLOP/img | '
            '% of peak | x float32 | x fused float32 | x contrib.amp | peak RSS MiB | '
            'RSS x float32 | RSS x contrib.amp | amp_cast / amp_multicast | conversion s |')
    lines += [head, '|' + '---|' * (head.count('|') - 1)]
    for r in report['rows']:
        casts = _casts(r['casts'])
        if r.get('casts_real_graph'):
            casts += ' (real graph: %s)' % _casts(r['casts_real_graph'])
        flop = r.get('flop_per_image')
        percent = r.get('percent_of_peak')
        lines.append('| %s |' % ' | '.join([
            r['phase'], str(r['batch_size']), r['label'],
            'ok' if r['status'] == 'ok' else 'FAILED: %s' % r['error'],
            _fmt(r['img_per_s_median']), _fmt(r['img_per_s_min']), _fmt(r['img_per_s_max']),
            _fmt(flop and flop / 1e9, '%.3f'),
            '-' if percent is None else '%.0f%% of %s' % (percent, r['peak_dtype']),
            _fmt(r['speedup_vs_float32'], '%.2fx'),
            _fmt(r.get('speedup_vs_float32_fused'), '%.2fx'),
            _fmt(r['speedup_vs_contrib_amp'], '%.2fx'),
            _fmt(r['peak_rss_mib'], '%.0f'), _fmt(r['memory_vs_float32'], '%.2fx'),
            _fmt(r['memory_vs_contrib_amp'], '%.2fx'), casts, _fmt(r['conversion_s'], '%.3f')]))
    lines += [''] + bench_memory.memory_markdown(
        bench_memory.memory_split(report['rows']),
        {r['mode']: r['label'] for r in report['rows'] if r['phase'] == 'train'})
    loss = report.get('loss_check')
    if loss:
        lines += ['', '## Training loss on one fixed synthetic batch (batch %d, SGD lr %g, '
                  'momentum %g)' % (cfg['batch_size'][0], LEARNING_RATE, MOMENTUM), '']
        if loss['status'] != 'ok':
            lines.append('FAILED: %s' % loss['error'])
        else:
            lines += ['| run | loss at step 0 | loss after %d steps | final - float32 final | '
                      'relative |' % loss['steps'], '|---|---|---|---|---|']
            for variant in ('float32', 'mxmp', 'mxmp_cast_params'):
                v = loss[variant]
                lines.append('| %s | %.5g | %.5g | %+.3g | %+.1f%% |' % (
                    mode_label(variant, cfg['dtype'], loss['emulated'] and variant != 'float32'),
                    v['initial'], v['final'], v['final_diff_vs_float32'],
                    100 * v['final_rel_diff_vs_float32']))
    rss_import = _fmt(min((r['rss_after_import_mib'] for r in report['rows']
                           if r.get('rss_after_import_mib')), default=None), '%.0f')
    lines += ['', ' '.join([
        'img/s: images per second of one iteration (forward [+ backward + update]);',
        'median/min/max over all timed iterations of all repeats.',
        "GFLOP/img: forward FLOP of one image, counted from the graph's Convolution and",
        'FullyConnected layers with their inferred shapes (2 per multiply-accumulate).',
        '%% of peak: img/s x GFLOP/img (x %d for training: forward + data and weight'
        % bench_flops.TRAIN_FACTOR,
        "gradients) divided by the GEMM peak of the row's dtype measured in this run",
        "(float32 rows: the float32 peak; low-precision rows: the target dtype's; none for",
        'emulated rows).',
        "(fused): inference ran oneDNN's fused graph (mxmp's default where the kernels exist).",
        'x float32 / x fused float32 / x contrib.amp: ratio of median img/s (> 1 is faster).',
        "peak RSS: largest ru_maxrss of the run's process in MiB (includes MXNet itself, about",
        '%s MiB after import); RSS x: ratio of peak RSS (< 1 is less memory).' % rss_import,
        'amp_cast / amp_multicast: cast nodes in the graph that runs. conversion s: amp.init',
        '(contrib.amp training), convert_hybrid_block or mxmp.convert, in seconds.'])]
    return '\n'.join(lines) + '\n'
