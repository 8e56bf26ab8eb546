"""The benchmark's text models: what the chart and the report call a sample (sequences of BERT,
sentence pairs of the encoder-decoder, images of the CNNs), and a smoke run of the tiny
encoder-decoder transformer (benchmarks.transformer) through scripts/benchmark.py in a
subprocess: sentences/s, FLOP per sentence against a hand count, bfloat16 layers, the loss check.
No timed assertions.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / 'scripts' / 'benchmark.py'


def fake_report(model, unit, seq_len=128, input_size=224):
    """A report of two ok rows (train and infer, float32), as scripts/benchmark.py writes it."""
    def row(phase):
        return dict(phase=phase, batch_size=8, mode='float32', label='float32', status='ok',
                    error=None, img_per_s_median=2.0, img_per_s_min=1.5, img_per_s_max=2.5,
                    flop_per_image=22.3e9, percent_of_peak=None, peak_dtype='float32',
                    speedup_vs_float32=1.0, speedup_vs_float32_fused=None,
                    speedup_vs_contrib_amp=None, peak_rss_mib=1000.0, memory_vs_float32=1.0,
                    memory_vs_contrib_amp=None, casts={'amp_cast': 0, 'amp_multicast': 0},
                    conversion_s=0.0, emulated=False, rss_after_import_mib=200.0,
                    tokens_per_sample=24.5 if unit == 'sent' else None)
    config = dict(model=model, unit=unit, seq_len=seq_len, input_size=input_size,
                  dtype='bfloat16', ctx='cpu', command='python scripts/benchmark.py',
                  warmup=1, iters=5, repeats=1, batch_size=[8])
    machine = dict(cpu_model='cpu', cpus=2, avx512_flags=[], threads=1,
                   loadavg_start=(0.0, 0.0, 0.0), loadavg_end=(0.0, 0.0, 0.0))
    return dict(config=config, machine=machine, rows=[row('train'), row('infer')], peaks={},
                lp_kernels_available=True, total_s=1.0)


@pytest.mark.parametrize('model, unit, shape, per_second', [
    ('bert_base', 'seq', 'sequence length 128', 'sequences/s'),
    ('transformer_nmt', 'sent', 'sentence pairs of 8-40 tokens', 'sentences/s'),
    ('resnet50_v1', 'img', 'input 224x224', 'images/s')])
def test_chart_and_report_name_the_sample_of_each_model(tmp_path, model, unit, shape,
                                                        per_second):
    from benchmarks.charts import bar_chart
    from benchmarks.report import markdown
    report = fake_report(model, unit, seq_len=40 if unit == 'sent' else 128)
    titles = bar_chart(report, str(tmp_path / 'chart.png'))
    assert titles[-1].startswith('%s, %s, bfloat16 on cpu' % (model, shape))
    assert titles[:4] == ['training, %s (median)' % per_second, 'inference, %s (median)'
                          % per_second, 'training, peak RSS (MiB)', 'inference, peak RSS (MiB)']
    others = {'images/s', 'sequences/s', 'sentences/s'} - {per_second}
    assert not any(o in t for o in others | {'224x224'} - {shape.split()[-1]} for t in titles)
    text = markdown(report)
    assert text.startswith('# mxmp benchmark: %s, %s, target dtype bfloat16' % (model, shape))
    assert '| %s/s median |' % unit in text and '| GFLOP/%s |' % unit in text
    assert ('24.5 valid target tokens per sentence' in text) is (unit == 'sent')


def test_seq_len_is_refused_for_an_image_model():
    proc = subprocess.run([sys.executable, str(SCRIPT), '--model', 'resnet18_v1', '--seq-len',
                           '64', '--output-dir', os.devnull], cwd=str(REPO),
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2
    assert '--seq-len is for the text models' in proc.stderr


def tiny_flop(src_len, tgt_len):
    """Forward FLOP of one sentence pair of transformer_tiny by hand (2 per multiply-add):
    d = 32 units, 2 heads, feed-forward 64, vocabulary 1000, one encoder and one decoder layer.
    GluonNLP's multi-head attention projects query, key and value with three Dense layers
    without bias and multiplies with batch_dot; the output layer is tied to the embedding."""
    d, h, v = 32, 64, 1000
    encoder = 2 * (4 * src_len * d * d + 2 * src_len * src_len * d + 2 * src_len * d * h)
    self_att = 4 * tgt_len * d * d + 2 * tgt_len * tgt_len * d
    cross_att = 2 * tgt_len * d * d + 2 * src_len * d * d + 2 * tgt_len * src_len * d
    decoder = 2 * (self_att + cross_att + 2 * tgt_len * d * h)
    return encoder + decoder + 2 * tgt_len * d * v


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    pytest.importorskip('gluonnlp', reason='the transformer models need the optional extra: '
                                           "pip install -e '.[bert]'")
    out = tmp_path_factory.mktemp('transformer')
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run([sys.executable, str(SCRIPT), '--model', 'transformer_tiny',
                           '--seq-len', '12', '--batch-size', '4', '--modes', 'float32', 'mxmp',
                           'float32_mxmp_kernels',
                           '--warmup', '1', '--iters', '5', '--repeats', '1', '--loss-steps',
                           '1', '--threads', '1', '--gemm-size', '0', '--output-dir', str(out)],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / 'benchmark.json') as f:
        return json.load(f), proc.stdout


def test_tiny_transformer_trains_and_infers_in_sentences_per_second(tiny_run):
    import mxnet as mx
    import numpy as np
    from benchmarks.transformer import sentence_batches
    report, stdout = tiny_run
    assert report['config']['unit'] == 'sent'
    assert '# mxmp benchmark: transformer_tiny, sentence pairs of 8-12 tokens' in stdout
    assert '| phase | batch | mode | status | sent/s median |' in stdout
    # the same seed as the worker: the batches the run cycled through
    batches = sentence_batches(mx, 'transformer_tiny', 4, 12, mx.cpu(),
                               np.random.RandomState(0))
    lengths = {(xs[0].shape[1], xs[1].shape[1]) for xs, _ in batches}
    assert len({xs[0].shape for xs, _ in batches} | {xs[1].shape for xs, _ in batches}) > 1
    assert all(8 <= s <= 12 and 8 <= t <= 12 for s, t in lengths)
    flop = round(np.mean([tiny_flop(xs[0].shape[1], xs[1].shape[1]) for xs, _ in batches]))
    tokens = np.mean(np.concatenate([xs[3].asnumpy() for xs, _ in batches]))
    rows = {(r['phase'], r['mode']): r for r in report['rows']}
    assert sorted(rows) == [('infer', 'float32'), ('infer', 'float32_mxmp_kernels'),
                            ('infer', 'mxmp'), ('train', 'float32'),
                            ('train', 'float32_mxmp_kernels'), ('train', 'mxmp')]
    for (phase, mode), r in rows.items():
        assert r['status'] == 'ok' and r['img_per_s_median'] > 0
        assert r['flop_per_image'] == flop
        assert r['tokens_per_sample'] == pytest.approx(tokens)
        # 6 encoder + 10 decoder Dense layers and the output layer; 6 attention products
        dtype = 'float32' if mode != 'mxmp' or r['emulated'] else 'bfloat16'
        assert r['layer_dtypes']['FullyConnected'] == {dtype: 17}
        assert r['layer_dtypes']['batch_dot'] == {'float32': 6}
        if mode == 'float32_mxmp_kernels':   # LayerNorm: 2 encoder, 3 decoder, 2 final
            assert r['library_ops']['mxmp_layer_norm'] == 7 and r['casts']['amp_cast'] == 0
    loss = report['loss_check']
    assert loss['status'] == 'ok' and loss['steps'] == 1
    # dropout off, the same weights and batch: the first losses differ by bfloat16 rounding
    assert loss['losses']['mxmp'][0] == pytest.approx(loss['losses']['float32'][0], rel=0.02)
