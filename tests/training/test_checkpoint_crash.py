"""Crash-safe checkpoints: a process SIGKILLed while writing a checkpoint leaves the previous one
loadable and intact.

The child process writes checkpoints with ``examples/train_imagenet.py``'s ``save_checkpoint``
(``epoch-NNNN.params`` from ``net.save_parameters``, ``epoch-NNNN.states`` from
``mxmp.Trainer.save_states``, then ``checkpoint.json``; every file through a temporary file,
fsync and rename). Checkpoint ``v`` holds bfloat16 parameters equal to ``v % 256`` and float32
master weights equal to ``v % 256 + 2**-10`` (not representable in bfloat16, so a reload from the parameters
instead of the masters is caught). The child dies at a deterministic point of the write
(first fsync or first rename of checkpoint 2, by SIGKILL to itself) or at random moments
(SIGKILL from the parent while it rewrites checkpoints in a loop); the parent then resumes with
the example's ``load_checkpoint`` and checks that the checkpoint ``checkpoint.json`` names is
complete and self-consistent.
"""
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import nd
from mxnet.contrib.amp.amp import bfloat16
from mxnet.gluon import nn

REPO = Path(__file__).resolve().parents[2]
UNITS = 512   # one 512x512 bfloat16 weight: 0.5 MB of parameters, 3 MB of trainer states

CHILD = r'''
import os, signal, sys
sys.path.insert(0, {repo!r})
sys.path.insert(0, {tests!r})
from test_checkpoint_crash import build, example, set_version
save_dir, mode, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
ex = example()
net, trainer = build()

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

version = start
while True:
    if mode in ('fsync', 'replace') and version == start + 1:
        setattr(os, mode, die)           # checkpoint start+1 dies inside its first write
    set_version(net, trainer, version)
    ex.save_checkpoint(save_dir, version, net, trainer, [], version, keep=2)
    print(version, flush=True)
    if mode != 'loop' and version > start + 1:
        break
    version += 1
'''


def example():
    spec = importlib.util.spec_from_file_location('train_imagenet_crash',
                                                  REPO / 'examples' / 'train_imagenet.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build():
    from mxmp._src.scaling import DynamicLossScaler
    from mxmp._src.training.trainer import Trainer
    with mx.name.NameManager():
        net = nn.HybridSequential(prefix='crash_')
        with net.name_scope():
            net.add(nn.Dense(UNITS, in_units=UNITS, use_bias=False))
    net.initialize(mx.init.Zero())
    net.cast(bfloat16)
    trainer = Trainer(net.collect_params(), 'adam', {'learning_rate': 0.01},
                      loss_scaler=DynamicLossScaler())
    return net, trainer


def weight(net):
    return list(net.collect_params().values())[0]


def value(version):
    """The parameter value of checkpoint ``version``: bfloat16 holds integers exactly only up
    to 256, and a fast machine writes hundreds of checkpoints in the loop below."""
    return version % 256


def set_version(net, trainer, version):
    param = weight(net)
    param.set_data(nd.amp_cast(nd.full(param.shape, value(version)), dtype=bfloat16))
    trainer.reset_master_weights()
    trainer.master_weights(param)[0][:] = value(version) + 2.0 ** -10


def check_loads_intact(save_dir):
    """Resume from ``save_dir`` like --resume; return the epoch, after checking every value."""
    ex = example()
    net, trainer = build()
    index = ex.load_checkpoint(str(save_dir), net, trainer)
    version = index['epoch']
    param = weight(net)
    values = nd.amp_cast(param.data(), dtype='float32').asnumpy()
    assert (values == value(version)).all()
    assert (trainer.master_weights(param)[0].asnumpy() == value(version) + 2.0 ** -10).all()
    return version


def start_child(save_dir, mode, start):
    code = CHILD.format(repo=str(REPO), tests=str(Path(__file__).resolve().parent))
    return subprocess.Popen([sys.executable, '-c', code, str(save_dir), mode, str(start)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize('point', ['fsync', 'replace'])
def test_sigkill_inside_a_checkpoint_write_leaves_the_previous_checkpoint_intact(tmp_path,
                                                                                 point):
    child = start_child(tmp_path, point, 1)
    out, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err[-2000:]
    assert out.split() == ['1']                  # checkpoint 1 done, 2 killed while written
    assert check_loads_intact(tmp_path) == 1
    leftovers = [f for f in os.listdir(tmp_path) if f.endswith('.tmp')]
    assert len(leftovers) <= 1                   # at most the killed write's temporary file


def test_repeated_random_sigkills_while_rewriting_checkpoints_never_break_the_last_one(
        tmp_path):
    rng = np.random.RandomState(0)
    start, kills = 1, 0
    while kills < 3:
        child = start_child(tmp_path, 'loop', start)
        first = child.stdout.readline().strip()  # one complete checkpoint of this child
        assert first == str(start), child.stderr.read()[-2000:]
        time.sleep(rng.uniform(0.0, 0.6))        # then die somewhere in the next writes
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
        kills += 1
        version = check_loads_intact(tmp_path)
        assert version >= start
        start = version + 1
