"""Statistics of the runs: one row per (phase, batch, mode) from its repeats, the ratios
between rows, the loss check's summary."""
import numpy as np


def aggregate(runs):
    """One row from the repeats of a (phase, batch, mode): statistics over every timed iteration.

    Returns a dict: status, img_per_s_{median,min,max} (images/s), peak_rss_mib (largest over
    the repeats, MiB), rss_after_import_mib, casts, casts_real_graph, layer_dtypes (op -> {dtype
    -> nodes} of the graph that ran), library_ops ({mxmp library op: nodes}, the
    float32_mxmp_kernels mode), conversion_s (median, seconds), emulated, error, repeats
    (per-repeat median images/s and peak RSS).
    """
    ok = [r for r in runs if r['status'] == 'ok']
    row = {'repeats': [{'status': r['status'],
                        'img_per_s_median': float(np.median(r['img_per_s']))
                        if r.get('img_per_s') else None,
                        'peak_rss_mib': r.get('peak_rss_mib'), 'log': r.get('log')}
                       for r in runs]}
    first = runs[0]
    for key in ('casts', 'casts_real_graph', 'emulated', 'lp_kernels_available', 'versions',
                'flop_per_image', 'fused', 'layer_dtypes', 'tokens_per_sample', 'library_ops'):
        row[key] = first.get(key)
    convs = [r['conversion_s'] for r in runs if r.get('conversion_s') is not None]
    row['conversion_s'] = float(np.median(convs)) if convs else None
    if len(ok) < len(runs):
        failed = [r for r in runs if r['status'] != 'ok'][0]
        row.update(status='failed', error=failed.get('error'), failed_stage=failed.get('stage'))
    else:
        row.update(status='ok', error=None)
    if ok:
        speeds = np.concatenate([r['img_per_s'] for r in ok])
        row.update(img_per_s_median=float(np.median(speeds)), img_per_s_min=float(speeds.min()),
                   img_per_s_max=float(speeds.max()), timed_iterations=int(speeds.size),
                   peak_rss_mib=max(r['peak_rss_mib'] for r in ok),
                   rss_after_import_mib=max(r['rss_after_import_mib'] for r in ok))
    else:
        row.update(img_per_s_median=None, img_per_s_min=None, img_per_s_max=None,
                   timed_iterations=0, peak_rss_mib=None, rss_after_import_mib=None)
    if row['status'] == 'failed':
        # Numbers of a partly failed row would be biased: report none.
        row.update(img_per_s_median=None, img_per_s_min=None, img_per_s_max=None)
    return row


def _ratio(a, b):
    return a / b if a is not None and b else None


def add_ratios(rows):
    """Speed and memory ratios against float32, fused float32 and contrib.amp of the same phase
    and batch.

    ``speedup_vs_*`` = median images/s of the row / median images/s of the reference (> 1:
    faster); ``memory_vs_*`` = peak RSS of the row / peak RSS of the reference (< 1: less
    memory). None when either side failed or did not run. The contrib.amp reference is the
    ``contrib_amp`` row, or the ``contrib_amp_fp32_attention`` row where ``contrib_amp`` has no
    throughput (GluonNLP's BERT); ``contrib_amp_reference`` names it (None without either).
    ``*_vs_float32_fused`` exists for inference only (the fused float32 row is the fastest
    float32 inference); ``*_vs_float32_mxmp_kernels`` where that mode ran (float32 with mxmp's
    float32 rewrites: what the target dtype itself buys).
    """
    for row in rows:
        peers = {r['mode']: r for r in rows
                 if r['phase'] == row['phase'] and r['batch_size'] == row['batch_size']}
        # contrib.amp as is, or its BERT workaround where it failed (benchmarks.bert)
        amp_ref = 'contrib_amp' if peers.get('contrib_amp', {}).get('img_per_s_median') or \
            'contrib_amp_fp32_attention' not in peers else 'contrib_amp_fp32_attention'
        row['contrib_amp_reference'] = amp_ref if amp_ref in peers else None
        for ref, key in (('float32', 'float32'), (amp_ref, 'contrib_amp'),
                         ('float32_fused', 'float32_fused'),
                         ('float32_mxmp_kernels', 'float32_mxmp_kernels')):
            other = peers.get(ref, {})
            row['speedup_vs_%s' % key] = _ratio(row.get('img_per_s_median'),
                                                other.get('img_per_s_median'))
            row['memory_vs_%s' % key] = _ratio(row.get('peak_rss_mib'),
                                               other.get('peak_rss_mib'))
    return rows


def loss_summary(result):
    """Final losses of the loss check and their relative difference to float32."""
    if result['status'] != 'ok':
        return {'status': 'failed', 'error': result.get('error'), 'log': result.get('log')}
    losses = result['losses']
    ref = losses['float32']
    out = {'status': 'ok', 'emulated': result['emulated'], 'steps': len(ref) - 1,
           'losses': losses, 'log': result.get('log')}
    for variant, values in losses.items():
        out[variant] = {'initial': values[0], 'final': values[-1],
                        'final_diff_vs_float32': values[-1] - ref[-1],
                        'final_rel_diff_vs_float32': (values[-1] - ref[-1]) / abs(ref[-1])}
    return out

