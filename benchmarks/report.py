"""The benchmark's Markdown report: configuration, one table of every row, the memory split,
the loss check and the legend."""
from benchmarks import flops as bench_flops
from benchmarks import memory as bench_memory
from benchmarks import peak as bench_peak
from benchmarks import transformer as bench_transformer
from benchmarks.modes import LEARNING_RATE, MOMENTUM, mode_label
from benchmarks.workloads import UNIT_NAMES, shape_label


def _fmt(value, spec='%.2f', none='-'):
    return none if value is None else spec % value


def _casts(c):
    return '-' if not c else '%d / %d' % (c['amp_cast'], c['amp_multicast'])


def layer_dtypes_markdown(rows):
    """Markdown lines: per row, the output dtypes of the counted layers in the block's graph
    (``layer_dtypes`` of the worker), e.g. ``FullyConnected: 74 bfloat16``; rows without them
    (a failure before the warm-up ended) are left out."""
    lines = []
    for r in rows:
        dtypes = r.get('layer_dtypes')
        if dtypes:
            lines.append('- %s %s: %s' % (r['phase'], r['label'], '; '.join(
                '%s: %s' % (op, ', '.join('%d %s' % (n, d) for d, n in sorted(per.items())))
                for op, per in sorted(dtypes.items()))))
    if not lines:
        return []
    return ['Output dtypes of the layers in the graph of the block (float32 inputs; rows marked '
            '(fused) ran oneDNN\'s fusion of this graph):', ''] + lines + ['']


def markdown(report):
    """The Markdown report: configuration, one table of every row, the loss check.

    Throughput is per image, per sequence where ``report['config']['unit']`` is ``'seq'``
    (BERT: the columns say seq/s and GFLOP/seq), or per sentence pair where it is ``'sent'``
    (the encoder-decoder transformers: sent/s, GFLOP/sent).
    """
    cfg, mach = report['config'], report['machine']
    unit = cfg.get('unit') or 'img'
    plural, singular = UNIT_NAMES[unit]
    shape = shape_label(cfg)
    lines = ['# mxmp benchmark: %s, %s, target dtype %s, %s'
             % (cfg['model'], shape, cfg['dtype'], cfg['ctx']), '',
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
    tokens = next((r['tokens_per_sample'] for r in report['rows']
                   if r.get('tokens_per_sample')), None)
    if tokens:
        lines += ['- %s/s: sentence pairs per second; the batches hold %.1f valid target tokens '
                  'per sentence on average (x %.1f = target tokens/s), padded to the longest '
                  'sentence of each batch; the runs cycle through %d seeded batches'
                  % (unit, tokens, tokens, bench_transformer.NUM_BATCHES), '']
    if any(r.get('emulated') for r in report['rows']):
        lines += ['**Rows marked (emulated) run float32 kernels with %s rounding: they measure '
                  'numerics and the cost of emulation, not %s speed.**' % (cfg['dtype'],
                                                                          cfg['dtype']), '']
    lines += bench_peak.limit_markdown(report.get('peaks') or {}, cfg['dtype'],
                                       report['machine']['threads'])
    head = ('| phase | batch | mode | status | %s/s median | min | max | GFLOP/%s | '
            "%% of peak | x float32 | x float32 mxmp's kernels | x fused float32 | "
            'x contrib.amp | peak RSS MiB | '
            'RSS x float32 | RSS x contrib.amp | amp_cast / amp_multicast | conversion s |'
            % (unit, unit))
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
            _fmt(r.get('speedup_vs_float32_mxmp_kernels'), '%.2fx'),
            _fmt(r.get('speedup_vs_float32_fused'), '%.2fx'),
            _fmt(r['speedup_vs_contrib_amp'], '%.2fx'),
            _fmt(r['peak_rss_mib'], '%.0f'), _fmt(r['memory_vs_float32'], '%.2fx'),
            _fmt(r['memory_vs_contrib_amp'], '%.2fx'), casts, _fmt(r['conversion_s'], '%.3f')]))
    lines += [''] + layer_dtypes_markdown(report['rows'])
    lines += bench_memory.memory_markdown(
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
        '%s/s: %s per second of one iteration (forward [+ backward + update]);'
        % (unit, plural),
        'median/min/max over all timed iterations of all repeats.',
        "GFLOP/%s: forward FLOP of one %s, counted from the graph's Convolution and"
        % (unit, singular + (' pair, averaged over the batches (padding included)'
                             if unit == 'sent' else '')),
        'FullyConnected layers (and batch_dot and attention matmuls) with their inferred',
        'shapes (2 per multiply-accumulate).',
        '%% of peak: %s/s x GFLOP/%s (x %d for training: forward + data and weight'
        % (unit, unit, bench_flops.TRAIN_FACTOR),
        "gradients) divided by the GEMM peak of the row's dtype measured in this run",
        "(float32 rows: the float32 peak; low-precision rows: the target dtype's; none for",
        'emulated rows).',
        "(fused): inference ran oneDNN's fused graph (mxmp's default where the kernels exist).",
        'x float32 / x fused float32 / x contrib.amp: ratio of median %s/s (> 1 is faster;' % unit,
        'x contrib.amp: against contrib.amp as is, or where that failed against contrib.amp',
        'with the attention and Dropout in float32). x float32 mxmp\'s kernels: against',
        "float32 with mxmp's float32 rewrites (library LayerNorm, softmax with lengths,",
        'Dropout; the reduction rule): what the target dtype itself buys.',
        "peak RSS: largest ru_maxrss of the run's process in MiB (includes MXNet itself, about",
        '%s MiB after import); RSS x: ratio of peak RSS (< 1 is less memory).' % rss_import,
        'amp_cast / amp_multicast: cast nodes in the graph that runs. conversion s: amp.init',
        '(contrib.amp training), convert_hybrid_block or mxmp.convert, in seconds.'])]
    return '\n'.join(lines) + '\n'
