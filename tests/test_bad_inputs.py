"""Every bad input of the project's list, one test each, asserting the message it gets.

The list (issue 7): unknown dtype, non-hybridizable block, op in no list, model converted twice,
NaN loss, corrupt or mismatched checkpoint (Trainer states, Module checkpoint, the example's
--resume), missing dataset, wrong RecordIO path, batch size larger than the dataset. This file is
the index: several of these are also tested where the code lives (tests/gluon/test_convert.py,
tests/graph/test_pass.py, tests/training/test_trainer.py, tests/examples/...); here each message is pinned
once, with the helpers imported from those files.
"""
import importlib.util
import json
import logging
from pathlib import Path

import mxnet as mx
import pytest
from mxnet import gluon

import mxmp
from mxmp._src.errors import LossScaleAtFloorError, NonFiniteForwardWarning

import helpers as tm
from helpers import small_resnet
from helpers import floor_trainer, nan_grad_step
from helpers import fresh_trainer, trained_bf16_trainer

REPO = Path(__file__).resolve().parents[1]


def load_script(relpath, name):
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def train_script():
    return load_script('examples/train_imagenet.py', 'train_imagenet_bad_inputs')


@pytest.fixture(scope='module')
def prepare_script():
    return load_script('scripts/prepare_fashion_mnist.py', 'prepare_fashion_mnist_bad_inputs')


def synthetic(save_dir, *extra):
    return ['--synthetic', '--synthetic-batches', '1', '--batch-size', '4', '--epochs', '1',
            '--save-dir', str(save_dir), '--no-progress', '--log-interval', '0'] + list(extra)


# ------------------------------------------------------------------ the pass and the block
def test_unknown_target_dtype_names_the_accepted_dtypes():
    with pytest.raises(ValueError, match="unknown target dtype 'float8'.*float16.*bfloat16"):
        mxmp.convert(small_resnet(), 'float8')


def test_non_hybridizable_block_is_refused_with_the_fix():
    class NotHybrid(gluon.Block):
        def forward(self, x):   # pylint: disable=arguments-differ
            return x * 2

    with pytest.raises(TypeError, match='needs a gluon.HybridBlock.*hybrid_forward'):
        mxmp.convert(NotHybrid(), 'bfloat16')


def test_op_in_no_list_runs_in_float32_and_is_logged(caplog, monkeypatch):
    from mxmp._src.policy import policy as policy_module
    policy = mxmp.Policy('bfloat16')
    classes = {k: v - {'Pooling'} for k, v in policy.classes.items()}   # as for a custom op
    monkeypatch.setattr(policy_module.Policy, 'classes', property(lambda self: classes))
    policy_module._warn_unlisted.cache_clear()
    sym = mx.sym.Pooling(mx.sym.var('data'), kernel=(2, 2), pool_type='max', name='pool')
    with caplog.at_level(logging.WARNING, logger='mxmp.policy'):
        rows = {r.name: r for r in mxmp.explain(sym, policy=policy)}
    assert rows['pool'].dtype == 'float32'
    assert 'Pooling is in no mxmp op list' in caplog.text


def test_model_converted_again_with_other_settings_is_refused_naming_the_fix():
    conv = mxmp.convert(small_resnet(), 'bfloat16', emulate=True)
    with pytest.raises(ValueError, match='already converted.*Build the network anew'):
        mxmp.convert(conv, 'float16')


# ------------------------------------------------------------------ NaN loss
def test_nan_loss_is_reported_as_a_forward_pass_problem_then_stops_at_the_floor():
    net, trainer = floor_trainer(1)
    with pytest.warns(NonFiniteForwardWarning, match='forward pass gave inf/NaN.*not an '
                                                     'overflow from loss scaling'):
        assert nan_grad_step(net, trainer, where='loss') is False
    with pytest.warns(NonFiniteForwardWarning):
        nan_grad_step(net, trainer, where='loss')
    with pytest.warns(NonFiniteForwardWarning), pytest.raises(
            LossScaleAtFloorError, match='forward pass itself was not finite.*floor_castdense'):
        nan_grad_step(net, trainer, where='loss')


# ------------------------------------------------------------------ checkpoints
def test_truncated_trainer_states_are_refused_and_nothing_is_loaded(tmp_path):
    _, trainer = trained_bf16_trainer('lp_')
    fname = tmp_path / 'trainer.states'
    trainer.save_states(str(fname))
    fname.write_bytes(fname.read_bytes()[:-100])
    _, fresh = fresh_trainer()
    with pytest.raises(ValueError, match='is truncated'):
        fresh.load_states(str(fname))
    assert fresh.skipped_steps == 0


def test_trainer_states_of_another_target_dtype_are_refused(tmp_path):
    _, trainer = trained_bf16_trainer('lp_')
    fname = tmp_path / 'trainer.states'
    trainer.save_states(str(fname))
    from helpers import cast_mlp
    from mxmp._src.scaling import DynamicLossScaler
    net16 = cast_mlp('lp_', 'float16')
    other = mxmp.Trainer(net16.collect_params(), 'sgd', {'learning_rate': .05, 'momentum': .9},
                         loss_scaler=DynamicLossScaler(init_scale=2.**6, growth_interval=4))
    with pytest.raises(ValueError, match='bfloat16 in the file but float16 here.*another '
                                         'target dtype'):
        other.load_states(str(fname))


def test_trainer_states_of_another_model_are_refused(tmp_path):
    _, trainer = trained_bf16_trainer('lp_')
    fname = tmp_path / 'trainer.states'
    trainer.save_states(str(fname))
    _, other = fresh_trainer('other_')
    with pytest.raises(ValueError, match="'lp_.*' in the file but 'other_"):
        other.load_states(str(fname))


def test_corrupt_scaler_state_is_refused_naming_the_field():
    state = mxmp.DynamicLossScaler().state_dict()
    state['scale'] = -3.0
    with pytest.raises(ValueError, match='invalid loss scaler state'):
        mxmp.DynamicLossScaler().load_state_dict(state)
    del state['counter']
    with pytest.raises(ValueError, match="misses the key 'counter'"):
        mxmp.DynamicLossScaler().load_state_dict(state)


@pytest.fixture
def module_checkpoint(tmp_path):
    prefix = str(tmp_path / 'mlp')
    mod = tm.ready(mxmp.Module(tm.mlp(), **tm.bf16()))
    mod.save_checkpoint(prefix, 1, save_optimizer_states=True)
    return prefix


def test_truncated_module_checkpoint_is_refused(module_checkpoint):
    params = Path(module_checkpoint + '-0001.params')
    params.write_bytes(params.read_bytes()[:len(params.read_bytes()) // 2])
    with pytest.raises(ValueError, match='cannot be read: truncated or corrupt.*earlier epoch'):
        mxmp.Module.load(module_checkpoint, 1, emulate=tm.EMULATE)


def test_corrupt_module_state_file_is_refused(module_checkpoint):
    state = Path(module_checkpoint + '-0001.mxmp.json')
    state.write_text(state.read_text()[:20])
    with pytest.raises(ValueError, match='mxmp.json is not valid JSON'):
        mxmp.Module.load(module_checkpoint, 1, emulate=tm.EMULATE)


def test_module_checkpoint_of_another_target_dtype_is_refused(module_checkpoint):
    with pytest.raises(ValueError, match="target dtype 'bfloat16' but 'float16' was asked for"
                                         ".*Omit target_dtype"):
        mxmp.Module.load(module_checkpoint, 1, target_dtype='float16', emulate=True)


def test_module_checkpoint_of_another_loss_scaler_is_refused(module_checkpoint):
    with pytest.raises(ValueError, match="is for 'NoOpLossScaler' but this scaler is "
                                         "'DynamicLossScaler'"):
        mxmp.Module.load(module_checkpoint, 1, loss_scaler='dynamic', emulate=tm.EMULATE)


@pytest.fixture
def example_run(train_script, tmp_path):
    train_script.main(synthetic(tmp_path / 'run', '--dtype', 'bfloat16'))
    return tmp_path / 'run'


def test_example_resume_from_a_truncated_checkpoint_names_the_file(train_script, example_run):
    params = example_run / 'epoch-0001.params'
    params.write_bytes(params.read_bytes()[:1000])
    with pytest.raises(train_script.ConfigError,
                       match='cannot load the parameters .*epoch-0001.params.*truncated or '
                             'corrupt'):
        train_script.main(synthetic(example_run, '--dtype', 'bfloat16', '--epochs', '2',
                                    '--resume'))


def test_example_resume_from_a_corrupt_index_names_the_file(train_script, example_run):
    index = example_run / 'checkpoint.json'
    index.write_text(index.read_text()[:30])
    with pytest.raises(train_script.ConfigError, match='checkpoint.json is corrupt or truncated'):
        train_script.main(synthetic(example_run, '--dtype', 'bfloat16', '--epochs', '2',
                                    '--resume'))


def test_example_resume_with_another_dtype_names_the_flag(train_script, example_run):
    with pytest.raises(train_script.ConfigError,
                       match='from another run \\(--dtype bfloat16 in the checkpoint but '
                             'float16 now\\)'):
        train_script.main(synthetic(example_run, '--dtype', 'float16', '--epochs', '2',
                                    '--resume'))
    assert json.loads((example_run / 'checkpoint.json').read_text())['epoch'] == 1


# ------------------------------------------------------------------ data
def test_missing_dataset_names_the_debian_package(prepare_script, tmp_path):
    with pytest.raises(prepare_script.DatasetError,
                       match='missing source file .*apt-get install dataset-fashion-mnist'):
        prepare_script.load_split(str(tmp_path / 'nowhere'), 'train')


def test_wrong_recordio_path_names_the_file_and_the_prepare_script(train_script, tmp_path):
    missing = str(tmp_path / 'nope' / 'train.rec')
    with pytest.raises(train_script.ConfigError,
                       match='--rec-train .*nope/train.rec not found.*prepare_fashion_mnist.py'):
        train_script.main(['--rec-train', missing, '--save-dir', str(tmp_path / 'run')])


def test_batch_size_larger_than_the_dataset_is_refused(train_script, tmp_path):
    rec, idx = tmp_path / 'train.rec', tmp_path / 'train.idx'
    rec.write_bytes(b'')
    idx.write_text(''.join('%d\t%d\n' % (i, i * 100) for i in range(3)))   # three records
    with pytest.raises(train_script.ConfigError,
                       match='--batch-size 8 is larger than the 3 records .*lower --batch-size'):
        train_script.main(['--rec-train', str(rec), '--rec-val', '', '--batch-size', '8',
                           '--save-dir', str(tmp_path / 'run')])
