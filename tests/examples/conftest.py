"""Fixtures for the tests of scripts/prepare_fashion_mnist.py and examples/train_imagenet*.py.

The data is a small synthetic Fashion-MNIST in the real IDX format (gzip, big-endian header), so
these tests need neither the Debian package nor the network.
"""
import gzip
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # mxmp from the work tree when it is not pip-installed
    sys.path.insert(0, str(REPO))


def load_script(relpath, name):
    """Import a script of the repo (scripts/..., examples/...) as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_idx(path, array, magic):
    """Write a uint8 array as a gzip IDX file: magic, big-endian int32 dims, then the bytes."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = magic.to_bytes(4, 'big') + b''.join(int(d).to_bytes(4, 'big') for d in array.shape)
    with gzip.open(path, 'wb') as f:
        f.write(header + array.tobytes())


def make_fake_fashion_mnist(directory, n_train=50, n_val=20, seed=0):
    """Four *-ubyte.gz files like Debian's dataset-fashion-mnist; returns the arrays written.

    Class c's images are bright (value 20 * c + noise) so a network can learn them.
    """
    rng = np.random.RandomState(seed)
    os.makedirs(directory, exist_ok=True)
    arrays = {}
    for split, n, img_name, lbl_name in (
            ('train', n_train, 'train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
            ('val', n_val, 't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')):
        labels = (np.arange(n) % 10).astype(np.uint8)
        rng.shuffle(labels)
        images = np.clip(labels[:, None, None] * 20.0 + rng.randint(0, 60, size=(n, 28, 28)),
                         0, 255).astype(np.uint8)
        write_idx(os.path.join(directory, img_name), images, 0x00000803)
        write_idx(os.path.join(directory, lbl_name), labels, 0x00000801)
        arrays[split] = (images, labels)
    return arrays


@pytest.fixture(scope='session')
def idx_writer():
    """The write_idx function (tests import nothing from conftest by name)."""
    return write_idx


@pytest.fixture(scope='session')
def prepare_module():
    return load_script('scripts/prepare_fashion_mnist.py', 'prepare_fashion_mnist')


@pytest.fixture(scope='session')
def train_module():
    return load_script('examples/train_imagenet.py', 'train_imagenet_example')


@pytest.fixture(scope='session')
def module_script():
    return load_script('examples/train_imagenet_module.py', 'train_imagenet_module_example')


@pytest.fixture
def fake_src(tmp_path):
    """(directory, arrays) of a fresh synthetic IDX dataset: 50 train, 20 val images."""
    src = tmp_path / 'src'
    return str(src), make_fake_fashion_mnist(str(src))


@pytest.fixture(scope='session')
def tiny_rec(tmp_path_factory, prepare_module):
    """RecordIO written by prepare_fashion_mnist from a synthetic set: 64 train, 32 val."""
    root = tmp_path_factory.mktemp('tiny_fm')
    make_fake_fashion_mnist(str(root / 'src'), n_train=64, n_val=32)
    out = root / 'rec'
    assert prepare_module.main(['--src', str(root / 'src'), '--out', str(out),
                                '--no-progress']) == 0
    return out
