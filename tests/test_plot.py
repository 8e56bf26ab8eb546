"""mxmp.plot: training curves from metrics.jsonl and the diagnose plots are valid PNG files."""
import json
import struct

import matplotlib.image
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon import nn

from mxmp.diagnose import diagnose
from mxmp.plot import plot_run, read_metrics

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def assert_png(path, min_width=400, min_height=300):
    """A real PNG: header bytes, IHDR size, readable, and not a blank canvas."""
    with open(path, 'rb') as f:
        blob = f.read()
    assert blob[:8] == PNG_MAGIC
    assert blob[12:16] == b'IHDR'
    width, height = struct.unpack('>II', blob[16:24])
    assert width >= min_width and height >= min_height
    assert len(blob) > 10000
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels[..., :3].std() > 0.01     # something is drawn


def write_run(path, steps=60, skipped=(1, 2, 30), epochs=3, truncated=False):
    """A metrics file in the format of examples/train_imagenet.py: one record per step
    (step, epoch, loss, loss_scale, skipped, lr) and one per epoch (epoch, step, val_top1,
    train_loss, img_per_sec)."""
    per_epoch = steps // epochs
    scale, lines = 65536.0, []
    for step in range(1, steps + 1):
        skip = step in skipped
        if skip:
            scale /= 2
        elif step % 20 == 0:
            scale *= 2
        epoch = (step - 1) // per_epoch + 1
        lines.append(json.dumps({'step': step, 'epoch': epoch,
                                 'loss': None if skip else 2.3 * np.exp(-step / 30.0),
                                 'loss_scale': scale, 'skipped': skip,
                                 'lr': 0.1 * (1 - step / steps)}))
        if step % per_epoch == 0:
            lines.append(json.dumps({'epoch': epoch, 'step': step, 'val_top1': 0.5 + 0.1 * epoch,
                                     'train_loss': 2.3 * np.exp(-step / 30.0),
                                     'img_per_sec': 100.0}))
    text = '\n'.join(lines) + '\n'
    if truncated:
        text += '{"step": %d, "epoch": 3, "lo' % (steps + 1)
    path.write_text(text)
    return path


def test_read_metrics_splits_step_and_epoch_records(tmp_path):
    steps, epochs = read_metrics(str(write_run(tmp_path / 'm.jsonl')))
    assert len(steps) == 60 and len(epochs) == 3
    assert [r['step'] for r in steps if r['skipped']] == [1, 2, 30]
    assert [r['val_top1'] for r in epochs] == pytest.approx([0.6, 0.7, 0.8])


def test_read_metrics_ignores_a_truncated_last_line_of_a_running_job(tmp_path):
    steps, _ = read_metrics(str(write_run(tmp_path / 'm.jsonl', truncated=True)))
    assert len(steps) == 60


def test_read_metrics_rejects_bad_lines_and_empty_files(tmp_path):
    bad = tmp_path / 'bad.jsonl'
    bad.write_text('{"step": 1, "loss": 1.0}\nnot json\n{"step": 2, "loss": 0.9}\n')
    with pytest.raises(ValueError, match='line 2'):
        read_metrics(str(bad))
    empty = tmp_path / 'empty.jsonl'
    empty.write_text('\n')
    with pytest.raises(ValueError, match='no metrics records'):
        read_metrics(str(empty))
    with pytest.raises(FileNotFoundError):
        read_metrics(str(tmp_path / 'missing.jsonl'))


def test_plot_run_writes_a_png(tmp_path):
    out = plot_run(str(write_run(tmp_path / 'm.jsonl')), str(tmp_path / 'sub' / 'curves.png'))
    assert out == str(tmp_path / 'sub' / 'curves.png')
    assert_png(out, min_width=1000, min_height=600)


def test_plot_run_without_accuracy_or_loss_scale_still_draws(tmp_path):
    path = tmp_path / 'f32.jsonl'
    path.write_text(''.join(json.dumps({'step': i, 'epoch': 1, 'loss': 1.0 / i, 'lr': 0.1})
                            + '\n' for i in range(1, 11)))
    assert_png(plot_run(str(path), str(tmp_path / 'c.png')))


@pytest.fixture(scope='module')
def report():
    mx.random.seed(0)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, in_units=8, activation='relu'), nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier())
    rng = np.random.RandomState(0)
    return diagnose(net, mx.nd.array(rng.normal(size=(8, 8))), mx.nd.array(np.arange(8) % 4),
                    gluon.loss.SoftmaxCrossEntropyLoss(), steps=2, verbose=False)


def test_diagnose_save_plots_writes_two_pngs(report, tmp_path):
    paths = report.save_plots(str(tmp_path / 'plots'))
    assert set(paths) == {'gradient_histogram', 'layer_ranges'}
    for path in paths.values():
        assert_png(path, min_height=250)


def test_layer_chart_for_bfloat16(report, tmp_path):
    from mxmp.plot import plot_layer_ranges
    assert_png(plot_layer_ranges(report, str(tmp_path / 'bf16.png'), 'bfloat16'),
               min_height=250)
