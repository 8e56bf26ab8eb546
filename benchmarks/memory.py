"""Peak memory split into a fixed part and a part per image, from rows at several batch sizes.

Peak RSS of a training process is about ``fixed + batch * per_image``: MXNet itself, the
weights, gradients, optimizer state and library caches do not grow with the batch; the
activations kept for the backward pass do. With two or more batch sizes the least-squares line
through (batch, peak RSS) gives both parts, and shows why a mixed-precision run's memory ratio
to float32 falls as the batch grows (it halves the per-image part, not the fixed one).
"""
import numpy as np

__all__ = ['memory_split', 'memory_markdown']


def memory_split(rows, phase='train'):
    """Per mode: the line through (batch size, peak RSS MiB) of its ok rows of ``phase``.

    Args:
        rows (list of dict): benchmark rows (``mode``, ``phase``, ``batch_size``,
            ``peak_rss_mib``, ``status``).
        phase (str): ``'train'`` (default) or ``'infer'``.

    Returns:
        dict: mode -> ``{'per_image_mib', 'fixed_mib', 'batches': [...], 'rss_mib': [...]}``
        for modes with at least two distinct batch sizes; empty otherwise.
    """
    out = {}
    for mode in dict.fromkeys(r['mode'] for r in rows):
        points = sorted((r['batch_size'], r['peak_rss_mib']) for r in rows
                        if r['mode'] == mode and r['phase'] == phase and r['status'] == 'ok'
                        and r.get('peak_rss_mib'))
        if len({b for b, _ in points}) < 2:
            continue
        batches, rss = zip(*points)
        slope, intercept = np.polyfit(batches, rss, 1)
        out[mode] = {'per_image_mib': float(slope), 'fixed_mib': float(intercept),
                     'batches': list(batches), 'rss_mib': list(rss)}
    return out


def memory_markdown(split, labels, reference='float32'):
    """Markdown lines for :func:`memory_split` (empty list when it is empty)."""
    if not split:
        return []
    ref = split.get(reference)
    lines = ['## Training memory: fixed part and per image (line through the batch sizes)', '',
             '| mode | batches | peak RSS MiB | per image MiB | fixed MiB | per image x %s | '
             'fixed - %s MiB |' % (reference, reference), '|---|---|---|---|---|---|---|']
    for mode, s in split.items():
        lines.append('| %s | %s | %s | %.1f | %.0f | %s | %s |' % (
            labels.get(mode, mode), ', '.join(map(str, s['batches'])),
            ', '.join('%.0f' % v for v in s['rss_mib']), s['per_image_mib'], s['fixed_mib'],
            '%.2fx' % (s['per_image_mib'] / ref['per_image_mib']) if ref else '-',
            '%+.0f' % (s['fixed_mib'] - ref['fixed_mib']) if ref else '-'))
    return lines + ['', 'Mixed precision halves the per-image part (activations), not the fixed '
                    'part (MXNet, weights, gradients, optimizer state, caches), so its memory '
                    'ratio to float32 falls toward the per-image ratio as the batch grows.', '']
