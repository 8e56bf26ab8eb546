"""mxmp._src.plotting: training curves from metrics.jsonl and the diagnose plots are valid PNG files."""
import json
import struct

import matplotlib.image
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon import nn

from mxmp._src.diagnose.capture import diagnose
from mxmp._src.plotting import plot_run, read_metrics

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
                    gluon.loss.SoftmaxCrossEntropyLoss(), steps=2, verbose=False,
                    target_dtype='float16')


def test_diagnose_save_plots_writes_two_pngs(report, tmp_path):
    paths = report.save_plots(str(tmp_path / 'plots'))
    assert set(paths) == {'gradient_histogram', 'layer_ranges'}
    for path in paths.values():
        assert_png(path, min_height=250)


def test_layer_chart_for_bfloat16(report, tmp_path):
    from mxmp._src.diagnose.report import layer_ranges_figure
    from mxmp._src.plotting import save_png
    assert_png(save_png(layer_ranges_figure(report, 'bfloat16'), str(tmp_path / 'bf16.png')),
               min_height=250)


# ---------------------------------------------------------------------- bfloat16 and titles
def test_histograms_are_drawn_in_each_formats_own_range(report, tmp_path):
    from mxmp._src.diagnose.stats import BFLOAT16, FLOAT16
    from mxmp._src.diagnose.report import gradient_histogram_figure
    spans = {}
    for fmt in (FLOAT16, BFLOAT16):
        fig = gradient_histogram_figure(report, fmt.name)
        (ax,) = fig.axes
        assert fmt.name in ax.get_title()
        labels = ax.get_legend_handles_labels()[1]
        spans[fmt.name] = (ax.get_xlim(), labels, [t.get_text() for t in ax.texts])
    (lo16, hi16), labels16, text16 = spans['float16']
    (lo_bf, hi_bf), labels_bf, text_bf = spans['bfloat16']
    # the x axis reaches each format's own limits: 2^-24 and 65504 vs 2^-126 and 3.39e38
    assert lo16 < -24 and hi16 > 16 and hi16 < 100
    assert lo_bf < -126 and hi_bf > 128
    assert 'become zero in float16 (< 2^-24)' in labels16
    assert 'become zero in bfloat16 (< 2^-126)' in labels_bf
    assert any('overflow in bfloat16 (> 3.38953e+38)' == l for l in labels_bf)
    assert any('bfloat16 subnormals (2^-133 .. 2^-126)' in l for l in labels_bf)
    assert '11 significant bits' in text16[0] and '8 significant bits' in text_bf[0]
    # bfloat16: nothing flushes, so no loss-scaled series, as the report says
    assert report.loss_scale['bfloat16'].zero_unscaled == 0
    assert not any('loss scale 2^' in l for l in labels_bf)
    assert 'no loss scale needed' in text_bf[0]
    p16 = report.save_plots(str(tmp_path / 'f16'), 'float16')['gradient_histogram']
    pbf = report.save_plots(str(tmp_path / 'bf16'), 'bfloat16')['gradient_histogram']
    with open(p16, 'rb') as a, open(pbf, 'rb') as b:
        assert a.read() != b.read()


def test_layer_ranges_for_bfloat16_have_bars(report):
    from mxmp._src.diagnose.report import layer_ranges_figure
    fig = layer_ranges_figure(report, 'bfloat16')
    ax_span, ax_frac = fig.axes
    widths = [bar.get_width() for c in ax_span.containers for bar in c]
    # three spans (activations, weights, gradients) per layer; weights only where a layer has
    assert sum(w > 0 for w in widths) >= 2 * len(report.layers)
    assert all(w >= 0 for w in widths)
    for c in ax_span.containers:
        for bar in c:
            if bar.get_width():
                assert -126 <= bar.get_x() and bar.get_x() + bar.get_width() <= 128
    assert 'bfloat16' in ax_span.get_title()
    # nothing is out of range in bfloat16: the right panel says so instead of empty rows
    assert all(bar.get_width() == 0 for c in ax_frac.containers for bar in c)
    assert any('no value overflows' in t.get_text() for t in ax_frac.texts)
    labels = fig.legends[0].get_texts()
    assert not any('loss scale' in t.get_text() for t in labels)


def test_report_table_states_the_formats_risk(report):
    bf16, f16 = report.table('bfloat16'), report.table('float16')
    assert '8 significant bits' in bf16 and 'precision is the risk' in bf16
    assert 'not underflow' in bf16 and 'loss scale: not needed' in bf16
    assert '11 significant bits' in f16 and 'underflow of small gradients is the risk' in f16


def run_figure_of(path, **kw):
    from mxmp._src.plotting import run_figure
    return run_figure(str(path), **kw)


def test_no_loss_scale_panel_when_nothing_was_scaled(tmp_path):
    flat = tmp_path / 'run' / 'metrics.jsonl'
    flat.parent.mkdir()
    flat.write_text(json.dumps({'model': 'resnet18_v1', 'dtype': 'bfloat16', 'emulate': False,
                                'cast_params': True, 'loss_scale_mode': 'auto'}) + '\n'
                    + ''.join(json.dumps({'step': i, 'epoch': 1, 'loss': 1.0 / i,
                                          'loss_scale': 1.0, 'skipped': False, 'lr': 0.1})
                              + '\n' for i in range(1, 11)))
    fig = run_figure_of(flat)
    assert len(fig.axes) == 3
    assert not any('loss scale' in ax.get_title() for ax in fig.axes)
    title = fig._suptitle.get_text()
    assert title == 'resnet18_v1, bfloat16 (cast params)'
    assert str(tmp_path) not in title
    scaled = write_run(tmp_path / 'scaled.jsonl')
    fig = run_figure_of(scaled, title='mine')
    assert len(fig.axes) == 4 and fig._suptitle.get_text() == 'mine'
    assert any('loss scale' in ax.get_title() for ax in fig.axes)


def test_title_from_summary_json_or_a_note(tmp_path):
    path = write_run(tmp_path / 'metrics.jsonl')
    assert 'not recorded' in run_figure_of(path)._suptitle.get_text()
    (tmp_path / 'summary.json').write_text(json.dumps({'model': 'cifar_resnet20_v1',
                                                       'dtype': 'float16', 'emulate': True}))
    assert run_figure_of(path)._suptitle.get_text() == 'cifar_resnet20_v1, float16 (emulated)'


def test_plot_run_creates_the_output_directories(tmp_path):
    out = tmp_path / 'a' / 'b' / 'curves.png'
    assert plot_run(str(write_run(tmp_path / 'm.jsonl')), str(out)) == str(out)
    assert_png(str(out))
