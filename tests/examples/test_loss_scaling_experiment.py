"""examples/loss_scaling_experiment.py: float16 (emulated) loses gradients without loss scaling.

A short run (40 steps of 32 synthetic images, easy classes) of the three trainings: float32,
emulated float16 without loss scaling, emulated float16 with dynamic loss scaling.
"""
import importlib.util
import json
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / 'examples' / 'loss_scaling_experiment.py'
FAST = ['--steps', '40', '--batch-size', '32', '--tail', '10', '--growth-interval', '10',
        '--signal', '1', '--log-level', 'WARNING']


@pytest.fixture(scope='module')
def experiment():
    spec = importlib.util.spec_from_file_location('loss_scaling_experiment', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def results(experiment, tmp_path_factory):
    out = tmp_path_factory.mktemp('lse') / 'results.json'
    returned = experiment.main(FAST + ['--out', str(out)])
    with open(out) as f:
        on_disk = json.load(f)
    assert on_disk['summary'] == returned['summary']
    return on_disk


def by_name(results):
    return {r['name']: r for r in results['runs']}


def test_without_loss_scaling_most_gradients_of_some_layer_flush_to_zero(results):
    plain = by_name(results)['float16 no scaling']
    fractions = plain['flushed_fraction']
    assert set(fractions) == set(results['parameter_shapes'])
    assert max(fractions.values()) > 0.5
    # The first convolution sits furthest from the loss: its gradients are the smallest.
    assert fractions['net_conv0_weight'] > 0.5
    assert plain['flushed_fraction_all'] > 0.2
    assert plain['measured_steps'] == 40
    assert plain['loss_scaler'] == 'none' and plain['final_loss_scale'] == 1.0


def test_with_dynamic_loss_scaling_almost_nothing_flushes(results):
    scaled = by_name(results)['float16 dynamic scaling']
    assert max(scaled['flushed_fraction'].values()) < 0.01
    assert max(scaled['flushed_gradient_mass'].values()) < 1e-4
    assert scaled['final_loss_scale'] >= 2.0 ** 16          # grew, never backed off below
    assert scaled['loss_scales'][0] == 2.0 ** 16
    assert scaled['loss_scaler'] == 'dynamic'
    assert scaled['loss_scaler_config']['growth_interval'] == 10


def test_dynamic_scaling_follows_float32_and_no_scaling_stalls(results):
    runs = by_name(results)
    f32 = runs['float32']['final_loss']
    scaled = runs['float16 dynamic scaling']['final_loss']
    plain = runs['float16 no scaling']['final_loss']
    assert runs['float32']['initial_loss'] - f32 > 1.0        # float32 learns
    assert abs(scaled - f32) < 0.1 + 0.2 * f32                 # scaling follows it
    assert not math.isfinite(plain) or plain > f32 + 1.0       # no scaling stalls/diverges
    assert 'flushed_fraction' not in runs['float32']           # nothing to compare against


def test_output_says_the_loss_was_made_small_on_purpose(results):
    note = results['summary']['note']
    assert 'loss multiplied by 2.38419e-07' in note and 'emulated' in note
    assert results['args']['loss_factor'] == 2.0 ** -22


def test_missing_recordio_file_is_a_clear_error(experiment, tmp_path, capsys):
    with pytest.raises(SystemExit):
        experiment.parse_args(['--data', 'rec', '--rec', str(tmp_path / 'none.rec')])
    assert 'prepare_fashion_mnist.py' in capsys.readouterr().err
