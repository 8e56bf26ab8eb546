"""benchmarks/accuracy_transformer.py: the GPT-on-the-Bible study end to end on a tiny config.

The study trains every run in its own subprocess (benchmarks/gpt.py); here three tiny runs
(float32, bfloat16, float16; 4 steps of a 1-layer model) run at once, then a second invocation
retrains only a run whose record was removed. Needs Debian's bible-kjv (scripts/install_dataset.sh
installs it; CI runs that script).
"""
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import accuracy_transformer as study_mod  # noqa: E402
from benchmarks import gpt, transformer_report  # noqa: E402

TINY = ['--steps', '4', '--batch-size', '4', '--context', '16', '--units', '32', '--layers', '1',
        '--heads', '2', '--warmup-steps', '1', '--eval-interval', '2', '--curve-windows', '16',
        '--eval-batch-size', '32', '--max-val-windows', '64', '--seeds', '0',
        '--float16-seeds', '0', '--jobs', '3']


def require_bible():
    if shutil.which('bible') is None:
        pytest.fail('the `bible` program is missing: install Debian\'s bible-kjv with '
                    '`sudo apt-get install -y bible-kjv` (or `sudo bash scripts/install_dataset.sh`)')


def tiny_argv(root):
    return TINY + ['--out', str(root / 'out'), '--work-dir', str(root / 'work')]


@pytest.fixture(scope='module')
def study(tmp_path_factory):
    require_bible()
    root = tmp_path_factory.mktemp('gpt_study')
    lines = []
    stats = study_mod.main(tiny_argv(root), log=lines.append)
    runs = {p.stem: json.loads(p.read_text()) for p in (root / 'out' / 'runs').glob('*.json')}
    return {'root': root, 'stats': stats, 'log': '\n'.join(lines), 'runs': runs}


def test_every_run_writes_its_record_with_curves_and_loss_scale_events(study):
    runs = study['runs']
    assert sorted(runs) == ['gpt-bfloat16-seed0', 'gpt-float16-seed0', 'gpt-float32-seed0']
    import mxmp
    assert runs['gpt-float16-seed0']['emulate'] is True          # no float16 GEMM on a CPU
    assert runs['gpt-bfloat16-seed0']['emulate'] is (not mxmp.lp_kernels_available('bfloat16'))
    assert runs['gpt-float32-seed0']['emulate'] is None
    for r in runs.values():
        assert r['config']['steps'] == 4 and r['val_chars'] == 64 * 16
        assert [p['step'] for p in r['curve']] == [0, 2, 4]
        assert math.isclose(r['final_val_ppl'], math.exp(r['final_val_loss']))
        # four steps of Adam lower the validation loss from the initial ~ln(73) = 4.29
        assert 4.0 < r['curve'][-1]['val_loss'] < r['curve'][0]['val_loss'] < 4.4
    # same seed, same initial weights: the step-0 validation losses agree to the 16-bit rounding
    v0 = {d: runs['gpt-%s-seed0' % d]['curve'][0]['val_loss'] for d in gpt.build_parser()
          ._option_string_actions['--dtype'].choices}
    assert abs(v0['bfloat16'] - v0['float32']) < 0.01 and abs(v0['float16'] - v0['float32']) < 0.01
    # ... and low precision changed the numbers
    assert runs['gpt-bfloat16-seed0']['final_val_loss'] != runs['gpt-float32-seed0']['final_val_loss']
    # float16 has dynamic loss scaling from 2**16; every skipped step is listed
    events = runs['gpt-float16-seed0']['loss_scale_events']
    assert events['first_scale'] == 2.0 ** 16
    assert len(events['skipped_steps']) == runs['gpt-float16-seed0']['skipped_steps']
    assert [s for s, _ in events['nonfinite_grads']] == events['skipped_steps']
    assert runs['gpt-bfloat16-seed0']['loss_scale_events']['first_scale'] == 1.0


def test_report_has_the_table_the_paired_difference_and_the_png(study):
    stats, out = study['stats'], study['root'] / 'out'
    per, paired = stats['per_dtype'], stats['paired']
    assert set(per) == {'float32', 'bfloat16', 'float16'}
    f32 = study['runs']['gpt-float32-seed0']['final_val_ppl']
    bf16 = study['runs']['gpt-bfloat16-seed0']['final_val_ppl']
    assert paired['bfloat16']['diffs'] == pytest.approx([100 * (bf16 / f32 - 1)])
    assert paired['bfloat16']['n'] == 1 and paired['bfloat16']['half_width'] is None
    table = (out / 'table.md').read_text()
    assert 'ppl(dtype) / ppl(float32) - 1' in table and 'Loss-scale events' in table
    assert 'float16 (emulated)' in table
    assert ('bfloat16 (real kernels)' in table) or ('bfloat16 (emulated)' in table)
    png = out / 'curves.png'
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and png.stat().st_size > 10000
    assert json.loads((out / 'results.json').read_text())['paired']['float16']['n'] == 1


def test_a_second_invocation_skips_the_runs_done_and_reruns_only_a_missing_one(study):
    out = study['root'] / 'out' / 'runs'
    victim, kept = out / 'gpt-bfloat16-seed0.json', out / 'gpt-float32-seed0.json'
    finished = json.loads(kept.read_text())['finished']
    old_ppl = json.loads(victim.read_text())['final_val_ppl']
    os.remove(victim)
    lines = []
    study_mod.main(tiny_argv(study['root']), log=lines.append)
    assert [l.split()[0] for l in lines if 'training:' in l] == ['gpt-bfloat16-seed0']
    assert sum(l.endswith('done, skipped') for l in lines) == 2
    assert json.loads(kept.read_text())['finished'] == finished
    # the rerun is deterministic: same seed, same perplexity
    assert json.loads(victim.read_text())['final_val_ppl'] == pytest.approx(old_ppl, rel=1e-6)


def test_a_record_made_with_another_configuration_does_not_count_as_done(study, tmp_path):
    args = study_mod.build_parser().parse_args(tiny_argv(study['root']))
    config = study_mod.run_config(args, 'float32', 0)
    path = str(study['root'] / 'out' / 'runs' / 'gpt-float32-seed0.json')
    assert study_mod.load_record(path, config) is not None
    assert study_mod.load_record(path, dict(config, steps=5)) is None
    assert study_mod.load_record(str(tmp_path / 'missing.json'), config) is None


def test_library_kernels_in_float32_and_mask_seeds_pair_with_a_reference_study(study):
    # the control of docs/accuracy.md's Dropout section: float32 with mxmp's library kernels
    # (--kernels all), and float32 with other masks (--mask-seed-offset), each paired with the
    # first study's float32 run of the seed (MXNet's kernels, the same weights and windows)
    from mxmp._src.kernels.build import load_library
    if load_library() is None:
        pytest.skip("mxmp's operator library does not build here (no C++ compiler?)")
    root, ref = study['root'], study['runs']['gpt-float32-seed0']['final_val_ppl']
    for name, extra, key, value in (('lib', ['--kernels', 'all'], 'kernels', 'all'),
                                    ('masks', ['--mask-seed-offset', '1000'], 'mask_seed', 1000)):
        argv = TINY[:-4] + ['--float16-seeds', '', '--jobs', '1', '--dtypes', 'float32',
                            '--out', str(root / name), '--work-dir', str(root / (name + '_w')),
                            '--reference', str(root / 'out')] + extra
        lines = []
        stats = study_mod.main(argv, log=lines.append)
        record = json.loads((root / name / 'runs' / 'gpt-float32-seed0.json').read_text())
        assert record['config'][key] == value
        ppl = record['final_val_ppl']
        assert ppl != ref      # other Dropout masks: another run
        against = stats['against_reference']['float32']
        assert against['seeds'] == [0]
        assert against['diffs'] == pytest.approx([100 * (ppl / ref - 1)])
        table = (root / name / 'table.md').read_text()
        assert "Against the reference study's float32 runs" in table
    assert "| float32 (mxmp's kernels='all') |" in (root / 'lib' / 'table.md').read_text()
    # the two controls against each other, from their folders
    ppl = {n: json.loads((root / n / 'runs' / 'gpt-float32-seed0.json').read_text())[
        'final_val_ppl'] for n in ('lib', 'masks')}
    seeds, diffs, ci = transformer_report.main([str(root / 'lib' / 'runs'),
                                                str(root / 'masks' / 'runs')])
    assert seeds == [0] and diffs == pytest.approx([100 * (ppl['lib'] / ppl['masks'] - 1)])
    assert ci['n'] == 1
    with pytest.raises(ValueError, match='share no'):
        transformer_report.compare_dirs([str(root / 'lib' / 'runs'), str(root / 'lib' / 'runs')],
                                        'bfloat16')
    with pytest.raises(SystemExit):
        study_mod.build_parser().parse_args(['--dtypes', 'float64'])


def test_relative_differences_and_their_interval_match_a_hand_computed_case():
    # ppl ratios 1.01, 0.98, 1.03 -> +1, -2, +3 percent: mean 2/3; sample std sqrt(19/3) =
    # 2.516611; t(0.975, 2) = 4.302653; half width 4.302653 * 2.516611 / sqrt(3) = 6.251609
    seeds, diffs = transformer_report.relative_differences(
        {0: 5.05, 1: 4.9, 2: 5.15, 7: 9.0}, {0: 5.0, 1: 5.0, 2: 5.0, 3: 5.0})
    assert seeds == [0, 1, 2] and diffs == pytest.approx([1.0, -2.0, 3.0])
    records = [{'config': {'dtype': d, 'seed': s}, 'final_val_ppl': p, 'emulate': e,
                'wall_s': 1.0, 'cpu_s': 1.0, 'train_s': 1.0, 'median_step_s': 0.1}
               for d, e, ppls in (('float32', None, (5.0, 5.0, 5.0)),
                                  ('bfloat16', False, (5.05, 4.9, 5.15)))
               for s, p in enumerate(ppls)]
    p = transformer_report.analyse(records)['paired']['bfloat16']
    assert p['n'] == 3 and p['mean'] == pytest.approx(2 / 3)
    assert p['std'] == pytest.approx(2.516611, abs=1e-6)
    assert p['half_width'] == pytest.approx(6.251609, abs=1e-6)
    assert (p['low'], p['high']) == pytest.approx((2 / 3 - 6.251609, 2 / 3 + 6.251609), abs=1e-6)
    with pytest.raises(ValueError, match='positive'):
        transformer_report.relative_differences({0: 1.0}, {0: 0.0})


def test_the_validation_part_is_hebrews_to_revelation():
    require_bible()
    text = gpt.load_bible()
    train, val = gpt.split_text(text)
    assert train + val == text and len(text) == 4298239
    assert val.startswith('Hebrews 1\n') and len(val) == 158926
    assert val.rstrip().endswith('The grace of our Lord Jesus Christ be with you all. Amen.')
    vocab = ''.join(sorted(set(text)))
    ids = gpt.encode(val, vocab)
    assert len(vocab) == 73 and ''.join(vocab[i] for i in ids[:9]) == 'Hebrews 1'
    x, y = gpt.validation_windows(ids, 128)
    assert x.shape == y.shape == ((len(val) - 1) // 128, 128)
    assert (x[:, 1:] == y[:, :-1]).all() and (x[1:, 0] == y[:-1, -1]).all()


def test_missing_bible_exits_with_status_2_and_names_the_apt_command(monkeypatch, tmp_path):
    monkeypatch.setattr(gpt, 'BIBLE_COMMAND', ('no-such-bible-program', 'gen1:1'))
    lines = []
    with pytest.raises(SystemExit) as exc:
        study_mod.main(['--out', str(tmp_path)], log=lines.append)
    assert exc.value.code == 2
    assert 'no-such-bible-program' in lines[0] and 'apt-get install -y bible-kjv' in lines[0]


def test_ngram_baseline_perplexity_matches_a_hand_computed_case():
    train, val = [0, 1, 0, 1, 0, 1], [0, 1, 0]
    # unigram: each symbol 3 of 6, smoothed (3 + 0.1) / (6 + 0.2) = 0.5 -> perplexity 2
    assert gpt.ngram_perplexity(train, val, 1, 2) == pytest.approx(2.0)
    # bigram: 0->1 seen 3 times of 3, 1->0 2 of 2: (3.1 / 3.2) and (2.1 / 2.2)
    expected = math.exp(-(math.log(3.1 / 3.2) + math.log(2.1 / 2.2)) / 2)
    assert gpt.ngram_perplexity(train, val, 2, 2) == pytest.approx(expected)
    # an unseen context falls back to the uniform 1 / V
    assert gpt.ngram_perplexity(train, [2, 2], 2, 3) == pytest.approx(3.0)


def test_residual_dtype_is_passed_to_low_precision_runs_only():
    """--residual-dtype target reaches benchmarks.gpt (Policy(residual_dtype=...)) for the
    bfloat16 runs; float32 runs keep the configuration of the studies they pair with."""
    from benchmarks import accuracy_transformer as study
    from benchmarks import gpt
    from benchmarks.transformer_report import dtype_label
    args = study.build_parser().parse_args(['--kernels', 'all', '--residual-dtype', 'target'])
    bf16, fp32 = study.run_config(args, 'bfloat16', 0), study.run_config(args, 'float32', 0)
    assert bf16['residual_dtype'] == 'target' and 'residual_dtype' not in fp32
    plain = study.run_config(study.build_parser().parse_args(['--kernels', 'all']), 'float32', 0)
    assert fp32 == plain
    argv = study.train_argv(bf16, 'out')
    assert argv[argv.index('--residual-dtype') + 1] == 'target'
    assert gpt.build_parser().parse_args(argv).residual_dtype == 'target'
    assert "residual_dtype='target'" in dtype_label([{'config': bf16, 'emulate': False}])


def test_post_ln_arch_reaches_the_runs_and_builds_a_post_layernorm_gpt():
    """--arch post-ln is recorded in every run's configuration and passed to benchmarks.gpt
    (the default, pre-ln, is not recorded: older records stay valid); the post-ln GPT puts a
    LayerNorm after every residual add, the pre-ln one feeds its LayerNorms to products only."""
    import mxnet as mx
    from benchmarks import accuracy_transformer as study
    args = study.build_parser().parse_args(['--arch', 'post-ln'])
    for dtype in ('float32', 'bfloat16'):
        config = study.run_config(args, dtype, 0)
        assert config['arch'] == 'post-ln'
        argv = study.train_argv(config, 'out')
        assert gpt.build_parser().parse_args(argv).arch == 'post-ln'
    assert 'arch' not in study.run_config(study.build_parser().parse_args([]), 'float32', 0)

    def consumers(arch):
        net = gpt.build_gpt(11, 8, 2, 2, 4, 0.1, arch)
        net.initialize()
        nodes = json.loads(net(mx.sym.var('tokens'), mx.sym.var('mask')).tojson())['nodes']
        of = {}
        for node in nodes:
            for src, _, _ in node['inputs']:
                of.setdefault(nodes[src]['op'], set()).add(node['op'])
        return of, sum(n['op'] == 'LayerNorm' for n in nodes)
    post, n_post = consumers('post-ln')
    pre, n_pre = consumers('pre-ln')
    assert post['elemwise_add'] == {'LayerNorm'} and n_post == n_pre == 5
    assert 'elemwise_add' in post['LayerNorm'] and 'FullyConnected' in post['LayerNorm']
    assert pre['LayerNorm'] == {'FullyConnected'} and 'elemwise_add' in pre['elemwise_add']
    with pytest.raises(ValueError, match="arch='mid-ln'"):
        gpt.build_gpt(11, 8, 2, 2, 4, 0.1, 'mid-ln')
