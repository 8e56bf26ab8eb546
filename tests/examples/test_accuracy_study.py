"""benchmarks/accuracy.py: the float32-vs-16-bit study's machinery on a tiny config (seconds)."""
import json
import math
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import accuracy  # noqa: E402


def tiny_argv(tiny_rec, out, work, *extra):
    return ['--rec-train', str(tiny_rec / 'train.rec'), '--rec-val', str(tiny_rec / 'val.rec'),
            '--epochs', '2', '--warmup-epochs', '0', '--batch-size', '16',
            '--max-train-batches', '2', '--seeds', '0-1', '--float16-seeds', '0',
            '--out', str(out), '--work-dir', str(work), '--in-process'] + list(extra)


@pytest.fixture(scope='module')
def study(tiny_rec, tmp_path_factory):
    root = tmp_path_factory.mktemp('accuracy')
    out, work = root / 'out', root / 'work'
    lines = []
    stats = accuracy.main(tiny_argv(tiny_rec, out, work), log=lines.append)
    return {'out': out, 'work': work, 'stats': stats, 'log': '\n'.join(lines),
            'tiny_rec': tiny_rec}


def test_every_run_writes_its_record_with_curve_and_config(study):
    runs = sorted(os.listdir(study['out'] / 'runs'))
    assert runs == ['small_cnn-bfloat16-seed0.json', 'small_cnn-bfloat16-seed1.json',
                    'small_cnn-float16-seed0.json', 'small_cnn-float32-seed0.json',
                    'small_cnn-float32-seed1.json']
    with open(study['out'] / 'runs' / 'small_cnn-float16-seed0.json') as f:
        record = json.load(f)
    assert record['config']['dtype'] == 'float16' and record['config']['epochs'] == 2
    assert record['emulate'] is True            # no float16 convolution on a CPU
    assert len(record['val_top1']) == 2 and 0 <= record['final_val_top1'] <= 1
    assert record['final_val_top1'] == record['val_top1'][-1]
    assert record['steps'] == 4 and record['wall_s'] > 0
    # float16 starts at 2**16 with dynamic scaling; every skipped step is listed
    events = record['loss_scale']
    assert events['first_scale'] == 2.0 ** 16
    assert len(events['skipped_steps']) == record['skipped_steps']


def test_report_has_the_table_the_interval_and_the_curves(study):
    stats = study['stats']
    per, paired = stats['per_dtype'], stats['paired']
    assert set(per) == {'float32', 'bfloat16', 'float16'}
    assert per['float32']['seeds'] == [0, 1]
    f32, bf16 = per['float32']['top1'], per['bfloat16']['top1']
    assert paired['bfloat16']['diffs'] == pytest.approx([b - a for a, b in zip(f32, bf16)])
    assert paired['bfloat16']['n'] == 2 and paired['bfloat16']['half_width'] is not None
    assert paired['float16']['n'] == 1 and paired['float16']['half_width'] is None
    table = (study['out'] / 'table.md').read_text()
    assert '95% CI of the mean' in table and 'Loss-scale events' in table
    assert ('bfloat16 (real kernels)' in table) or ('bfloat16 (emulated)' in table)
    png = study['out'] / 'curves.png'
    assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and png.stat().st_size > 10000
    assert json.loads((study['out'] / 'results.json').read_text())['paired']['bfloat16']


def test_a_second_invocation_skips_the_runs_done_and_reruns_only_a_missing_one(study):
    victim = study['out'] / 'runs' / 'small_cnn-bfloat16-seed1.json'
    kept = study['out'] / 'runs' / 'small_cnn-float32-seed0.json'
    finished = json.loads(kept.read_text())['finished']
    os.remove(victim)
    lines = []
    accuracy.main(tiny_argv(study['tiny_rec'], study['out'], study['work']), log=lines.append)
    trained = [l.split()[0] for l in lines if 'train_imagenet.py' in l]
    assert trained == ['small_cnn-bfloat16-seed1']
    # its checkpoint in the work dir is complete and of the same configuration: resumed (no
    # step is trained again), and the record is written anew from it
    assert any(l.startswith('small_cnn-bfloat16-seed1 ') and 'training (resumed)' in l
               for l in lines)
    assert sum(l.endswith('), skipped') for l in lines) == 4
    assert victim.is_file()
    assert json.loads(kept.read_text())['finished'] == finished


def test_a_record_made_with_another_configuration_does_not_count_as_done(study, tmp_path):
    path = study['out'] / 'runs' / 'small_cnn-float32-seed0.json'
    args = accuracy.build_parser().parse_args(
        tiny_argv(study['tiny_rec'], study['out'], study['work']))
    config = accuracy.run_config(args, 'float32', 0)
    assert accuracy.load_record(str(path), config) is not None
    assert accuracy.load_record(str(path), dict(config, epochs=3)) is None
    assert accuracy.load_record(str(tmp_path / 'missing.json'), config) is None


def test_paired_interval_matches_a_hand_computed_case():
    # diffs 0.1, -0.2, 0.3: mean 1/15; sample std sqrt(0.19/3) = 0.251661; t(0.975, 2) =
    # 4.302653; half width 4.302653 * 0.251661 / sqrt(3) = 0.625160
    ci = accuracy.paired_ci([0.1, -0.2, 0.3])
    assert ci['n'] == 3
    assert ci['mean'] == pytest.approx(1 / 15)
    assert ci['std'] == pytest.approx(0.251661, abs=1e-6)
    assert ci['t'] == pytest.approx(4.302653, abs=1e-6)
    assert ci['half_width'] == pytest.approx(0.625160, abs=1e-6)
    assert ci['low'] == pytest.approx(1 / 15 - 0.625160, abs=1e-6)
    assert ci['high'] == pytest.approx(1 / 15 + 0.625160, abs=1e-6)
    # 5 seeds: t(0.975, 4) = 2.776445
    assert accuracy.paired_ci([0, 1, 0, 1, 0])['t'] == pytest.approx(2.776445, abs=1e-6)
    one = accuracy.paired_ci([0.4])
    assert one['mean'] == 0.4 and one['half_width'] is None
    with pytest.raises(ValueError):
        accuracy.paired_ci([])


def test_seed_lists_parse_ranges_and_lists():
    assert accuracy.parse_seeds('0-4') == [0, 1, 2, 3, 4]
    assert accuracy.parse_seeds('0,2, 5') == [0, 2, 5]
    assert accuracy.parse_seeds('') == []


def test_missing_data_exits_with_status_2_and_names_the_prepare_script(tmp_path):
    lines = []
    with pytest.raises(SystemExit) as exc:
        accuracy.main(['--rec-train', str(tmp_path / 'nope.rec'), '--out', str(tmp_path)],
                      log=lines.append)
    assert exc.value.code == 2
    assert 'prepare_fashion_mnist.py' in lines[0] and 'nope.rec' in lines[0]
