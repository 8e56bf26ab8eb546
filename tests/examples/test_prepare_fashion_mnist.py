"""scripts/prepare_fashion_mnist.py: IDX -> ImageNet-layout RecordIO."""
import gzip
import os
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / 'scripts' / 'prepare_fashion_mnist.py')


def read_records(rec_dir, split):
    record = mx.recordio.MXIndexedRecordIO(os.path.join(rec_dir, split + '.idx'),
                                           os.path.join(rec_dir, split + '.rec'), 'r')
    out = []
    for key in record.keys:
        header, img = mx.recordio.unpack_img(record.read_idx(key))
        out.append((key, header, img))
    record.close()
    return out


def run_script(*args):
    return subprocess.run([sys.executable, SCRIPT, '--no-progress'] + list(args),
                          capture_output=True, text=True, timeout=120)


def test_records_round_trip_as_three_channel_images_with_their_labels(prepare_module, fake_src,
                                                                      tmp_path):
    src, arrays = fake_src
    out = str(tmp_path / 'out')
    assert prepare_module.main(['--src', src, '--out', out, '--no-progress']) == 0
    for split in ('train', 'val'):
        images, labels = arrays[split]
        records = read_records(out, split)
        assert [key for key, _, _ in records] == list(range(len(images)))
        for key, header, img in records:
            assert img.shape == (28, 28, 3) and img.dtype == np.uint8
            for c in range(3):  # gray replicated, PNG is lossless
                np.testing.assert_array_equal(img[:, :, c], images[key])
            assert header.label == float(labels[key])
            assert header.id == key


def test_image_record_iter_reads_the_output_as_batches_of_3x28x28(prepare_module, fake_src,
                                                                   tmp_path):
    src, arrays = fake_src
    out = str(tmp_path / 'out')
    assert prepare_module.main(['--src', src, '--out', out, '--no-progress']) == 0
    it = mx.io.ImageRecordIter(path_imgrec=os.path.join(out, 'val.rec'),
                               path_imgidx=os.path.join(out, 'val.idx'), data_shape=(3, 28, 28),
                               batch_size=10, shuffle=False, ctx='cpu', verbose=False)
    batch = next(iter(it))
    assert batch.data[0].shape == (10, 3, 28, 28)
    images, labels = arrays['val']
    np.testing.assert_array_equal(batch.label[0].asnumpy(), labels[:10].astype(np.float32))
    np.testing.assert_array_equal(batch.data[0].asnumpy()[:, 1], images[:10].astype(np.float32))


def test_max_train_and_max_val_write_the_first_images_only(prepare_module, fake_src, tmp_path):
    src, arrays = fake_src
    out = str(tmp_path / 'out')
    assert prepare_module.main(['--src', src, '--out', out, '--max-train', '7', '--max-val', '3',
                                '--no-progress']) == 0
    train, val = read_records(out, 'train'), read_records(out, 'val')
    assert len(train) == 7 and len(val) == 3
    assert [h.label for _, h, _ in val] == [float(x) for x in arrays['val'][1][:3]]


def test_complete_outputs_are_kept_and_force_or_a_different_count_rewrites_them(
        prepare_module, fake_src, tmp_path):
    src, _ = fake_src
    out = str(tmp_path / 'out')
    args = ['--src', src, '--out', out, '--no-progress']
    assert prepare_module.main(args) == 0
    rec = os.path.join(out, 'train.rec')
    os.utime(rec, (1, 1))
    assert prepare_module.main(args) == 0
    assert os.path.getmtime(rec) == 1  # skipped: counts match
    assert prepare_module.main(args + ['--force']) == 0
    assert os.path.getmtime(rec) > 1
    os.utime(rec, (1, 1))
    assert prepare_module.main(args + ['--max-train', '10']) == 0
    assert os.path.getmtime(rec) > 1
    assert len(read_records(out, 'train')) == 10
    assert not [f for f in os.listdir(out) if f.endswith('.tmp')]


def test_truncated_index_counts_as_incomplete_and_is_rewritten(prepare_module, fake_src,
                                                               tmp_path):
    src, arrays = fake_src
    out = str(tmp_path / 'out')
    args = ['--src', src, '--out', out, '--no-progress']
    assert prepare_module.main(args) == 0
    idx = os.path.join(out, 'train.idx')
    with open(idx) as f:
        lines = f.readlines()
    with open(idx, 'w') as f:
        f.writelines(lines[:5])
    assert prepare_module.count_records(os.path.join(out, 'train.rec'), idx) == 5
    assert prepare_module.main(args) == 0
    assert len(read_records(out, 'train')) == len(arrays['train'][0])


def test_missing_dataset_exits_non_zero_and_names_the_debian_package(tmp_path):
    result = run_script('--src', str(tmp_path / 'nowhere'), '--out', str(tmp_path / 'out'))
    assert result.returncode != 0
    assert 'sudo apt-get install dataset-fashion-mnist' in result.stderr
    assert str(tmp_path / 'nowhere') in result.stderr


def test_missing_single_file_is_named(prepare_module, fake_src, tmp_path, caplog):
    src, _ = fake_src
    os.remove(os.path.join(src, 't10k-labels-idx1-ubyte.gz'))
    assert prepare_module.main(['--src', src, '--out', str(tmp_path / 'out'),
                                '--no-progress']) == 1
    assert 't10k-labels-idx1-ubyte.gz' in caplog.text
    assert 'apt-get install dataset-fashion-mnist' in caplog.text


def test_corrupt_gzip_is_reported_as_corrupt(prepare_module, fake_src, tmp_path, caplog):
    src, _ = fake_src
    with open(os.path.join(src, 'train-images-idx3-ubyte.gz'), 'wb') as f:
        f.write(b'this is not gzip data at all')
    assert prepare_module.main(['--src', src, '--out', str(tmp_path / 'out'),
                                '--no-progress']) == 1
    assert 'train-images-idx3-ubyte.gz' in caplog.text and 'corrupt' in caplog.text


def test_truncated_gzip_is_reported(prepare_module, fake_src, tmp_path, caplog):
    src, _ = fake_src
    path = os.path.join(src, 'train-images-idx3-ubyte.gz')
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:len(data) // 2])
    assert prepare_module.main(['--src', src, '--out', str(tmp_path / 'out'),
                                '--no-progress']) == 1
    assert 'truncated' in caplog.text


def test_wrong_magic_number_is_reported(prepare_module, fake_src, tmp_path, caplog,
                                        idx_writer):
    src, arrays = fake_src
    # a labels file where the images file should be
    idx_writer(os.path.join(src, 'train-images-idx3-ubyte.gz'), arrays['train'][1], 0x00000801)
    assert prepare_module.main(['--src', src, '--out', str(tmp_path / 'out'),
                                '--no-progress']) == 1
    assert 'magic' in caplog.text and '0x00000803' in caplog.text


def test_header_announcing_more_data_than_present_is_reported(prepare_module, tmp_path):
    path = str(tmp_path / 'x.gz')
    with gzip.open(path, 'wb') as f:
        f.write((0x00000801).to_bytes(4, 'big') + (100).to_bytes(4, 'big') + bytes(50))
    with pytest.raises(prepare_module.DatasetError, match='truncated or corrupt'):
        prepare_module.read_idx(path, 0x00000801)


def test_jpeg_records_decode_close_to_the_source(prepare_module, fake_src, tmp_path):
    src, arrays = fake_src
    out = str(tmp_path / 'out')
    assert prepare_module.main(['--src', src, '--out', out, '--format', 'jpg',
                                '--no-progress']) == 0
    images, _ = arrays['val']
    for key, _, img in read_records(out, 'val'):
        assert img.shape == (28, 28, 3)
        err = np.abs(img[:, :, 0].astype(float) - images[key]).mean()
        assert err < 8.0  # quality 95 on noisy 28x28 images
