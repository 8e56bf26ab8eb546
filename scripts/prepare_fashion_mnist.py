#!/usr/bin/env python3
"""Write Fashion-MNIST as ImageNet-layout RecordIO (train.rec/.idx, val.rec/.idx).

Source: Debian's ``dataset-fashion-mnist`` package, which installs the four IDX files
(``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``, ``t10k-images-idx3-ubyte.gz``,
``t10k-labels-idx1-ubyte.gz``) in /usr/share/datasets/fashion-mnist. MXNet's own
``gluon.data.vision.FashionMNIST`` rejects those recompressed files (and tries to download), so this
script reads the IDX format itself (format: http://yann.lecun.com/exdb/mnist/, "FILE FORMATS";
magic 0x00000803 for images, 0x00000801 for labels, big-endian int32 dimensions, uint8 data).

Output (what ``tools/im2rec.py`` writes for ImageNet, read by ``mx.io.ImageRecordIter``):
``OUT/train.rec`` + ``OUT/train.idx`` (the 60,000 training images, or the first --max-train) and
``OUT/val.rec`` + ``OUT/val.idx`` (the 10,000 test images, or the first --max-val). Each record is
``mx.recordio.pack_img`` of a 28x28x3 uint8 image (the gray channel replicated three times),
PNG-encoded (lossless) by default, with the class id (0-9) as the float label of its IRHeader and
the record's index as its id. Both source files are already shuffled, so their first N images are a
class-balanced subset.

Files are written under temporary names and renamed when complete, so an interrupted run never
leaves outputs that look complete; outputs whose record count matches are kept unless --force.

Example::

    python scripts/prepare_fashion_mnist.py --out data/fashion-mnist
    python scripts/prepare_fashion_mnist.py --max-train 10000 --max-val 2000 --out /tmp/fm
"""
import argparse
import gzip
import logging
import os
import sys
import warnings
import zlib

import numpy as np

LOG = logging.getLogger('prepare_fashion_mnist')

DEFAULT_SRC = '/usr/share/datasets/fashion-mnist'
INSTALL_HINT = 'sudo apt-get install dataset-fashion-mnist'

# split name -> (images file, labels file) in the source directory
SPLITS = {
    'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
    'val': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'),
}
IMAGES_MAGIC = 0x00000803  # unsigned byte data, 3 dimensions (N, rows, cols)
LABELS_MAGIC = 0x00000801  # unsigned byte data, 1 dimension (N,)
NUM_CLASSES = 10


class DatasetError(Exception):
    """A source file is missing, corrupt or wrong; the message says how to fix it."""


def read_idx(path, expected_magic):
    """Read one gzip-compressed IDX file of unsigned bytes.

    Parameters
    ----------
    path : str
        Path of a ``*-ubyte.gz`` file.
    expected_magic : int
        ``0x00000803`` for an images file (N, rows, cols) or ``0x00000801`` for a labels file (N,).

    Returns
    -------
    numpy.ndarray of uint8, shape (N, rows, cols) or (N,).

    Raises
    ------
    DatasetError
        The file is missing, is not valid gzip, is truncated, has the wrong magic number, or holds
        fewer/more bytes than its header announces.
    """
    if not os.path.isfile(path):
        raise DatasetError('missing source file %s; install the data with `%s` or pass --src '
                           'DIR holding the four Fashion-MNIST *-ubyte.gz files'
                           % (path, INSTALL_HINT))
    try:
        with gzip.open(path, 'rb') as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as err:
        raise DatasetError('cannot decompress %s (%s: %s): the file is corrupt or truncated; '
                           'reinstall it with '
                           '`sudo apt-get install --reinstall dataset-fashion-mnist`'
                           % (path, type(err).__name__, err)) from err
    if len(raw) < 4:
        raise DatasetError('%s is too short (%d bytes) to be an IDX file' % (path, len(raw)))
    magic = int.from_bytes(raw[:4], 'big')
    if magic != expected_magic:
        kind = 'images' if expected_magic == IMAGES_MAGIC else 'labels'
        raise DatasetError('%s: wrong IDX magic number 0x%08x, expected 0x%08x (%s); is this the '
                           'right file?' % (path, magic, expected_magic, kind))
    ndim = magic & 0xff
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError('%s: truncated IDX header' % path)
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DatasetError('%s: header announces shape %s (%d bytes of data) but the file holds '
                           '%d; the file is truncated or corrupt' % (path, shape, expected,
                                                                 len(raw) - header))
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_split(src, split):
    """Load one split from the Debian IDX files.

    Parameters
    ----------
    src : str
        Directory with the four ``*-ubyte.gz`` files.
    split : str
        ``'train'`` (the 60,000 training images) or ``'val'`` (the 10,000 t10k test images).

    Returns
    -------
    (images, labels): uint8 arrays of shape (N, 28, 28) and (N,).

    Raises
    ------
    DatasetError
        A file is missing or corrupt, the counts of images and labels differ, or a label is not in
        0..9.
    """
    img_name, lbl_name = SPLITS[split]
    images = read_idx(os.path.join(src, img_name), IMAGES_MAGIC)
    labels = read_idx(os.path.join(src, lbl_name), LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise DatasetError('%s split: %d images but %d labels in %s' % (
            split, images.shape[0], labels.shape[0], src))
    if labels.size and labels.max() >= NUM_CLASSES:
        raise DatasetError('%s split: label %d out of range 0..%d in %s' % (
            split, labels.max(), NUM_CLASSES - 1, os.path.join(src, lbl_name)))
    return images, labels


def count_records(rec_path, idx_path):
    """Number of records in a complete ``.rec``/``.idx`` pair, or None when missing or incomplete.

    A pair is complete when both files exist, every ``.idx`` line is ``key<TAB>offset`` and the
    last offset lies inside the ``.rec`` file.
    """
    if not (os.path.isfile(rec_path) and os.path.isfile(idx_path)):
        return None
    rec_size = os.path.getsize(rec_path)
    n, last = 0, -1
    with open(idx_path) as f:
        for line in f:
            parts = line.split('\t')
            if len(parts) != 2:
                return None
            try:
                last = int(parts[1])
            except ValueError:
                return None
            n += 1
    if n == 0 or last >= rec_size:
        return None
    return n


def write_split(images, labels, rec_path, idx_path, img_fmt='.png', quality=None,
                progress=True):
    """Write images and labels as an indexed RecordIO pair (what im2rec writes).

    Parameters
    ----------
    images : numpy.ndarray, uint8, shape (N, H, W)
        Gray images; each is replicated to 3 channels (H, W, 3) before encoding.
    labels : numpy.ndarray, shape (N,)
        Class ids; stored as the float label of the record's IRHeader.
    rec_path, idx_path : str
        Output files; written as ``*.tmp`` and renamed at the end.
    img_fmt : str
        ``'.png'`` (lossless, default) or ``'.jpg'``.
    quality : int or None
        PNG compression level 0-9 (default 1: fast, the images are tiny) or JPEG quality
        (default 95).
    progress : bool
        Show a tqdm bar.
    """
    import mxnet as mx  # imported here so the IDX checks above run without MXNet
    from tqdm import tqdm

    if quality is None:
        quality = 1 if img_fmt == '.png' else 95
    tmp_rec, tmp_idx = rec_path + '.tmp', idx_path + '.tmp'
    record = mx.recordio.MXIndexedRecordIO(tmp_idx, tmp_rec, 'w')
    try:
        with warnings.catch_warnings():
            # pack_img calls ndarray.tostring(), deprecated in numpy >= 1.19.
            warnings.simplefilter('ignore', DeprecationWarning)
            for i in tqdm(range(len(images)), desc=os.path.basename(rec_path), unit='img',
                          disable=not progress, mininterval=1.0):
                img = np.repeat(images[i][:, :, None], 3, axis=2)
                header = mx.recordio.IRHeader(0, float(labels[i]), i, 0)
                record.write_idx(i, mx.recordio.pack_img(header, img, quality=quality,
                                                         img_fmt=img_fmt))
    finally:
        record.close()
    os.replace(tmp_rec, rec_path)
    os.replace(tmp_idx, idx_path)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Write Debian\'s Fashion-MNIST IDX files as ImageNet-layout RecordIO '
                    '(train.rec/.idx, val.rec/.idx) for examples/train_imagenet.py.')
    parser.add_argument('--src', default=DEFAULT_SRC,
                        help='directory with the four *-ubyte.gz files (default: %(default)s, '
                             'from `' + INSTALL_HINT + '`)')
    parser.add_argument('--out', default=os.path.join('data', 'fashion-mnist'),
                        help='output directory (default: %(default)s)')
    parser.add_argument('--max-train', type=int, default=None,
                        help='write only the first N training images (default: all 60,000)')
    parser.add_argument('--max-val', type=int, default=None,
                        help='write only the first N validation (t10k) images '
                             '(default: all 10,000)')
    parser.add_argument('--format', choices=('png', 'jpg'), default='png',
                        help='image encoding (default: %(default)s, lossless)')
    parser.add_argument('--quality', type=int, default=None,
                        help='PNG compression 0-9 (default 1) or JPEG quality (default 95; '
                             'use 95 or more)')
    parser.add_argument('--force', action='store_true',
                        help='rewrite outputs even when they exist and are complete')
    parser.add_argument('--no-progress', action='store_true', help='no progress bars')
    args = parser.parse_args(argv)
    for name in ('max_train', 'max_val'):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error('--%s must be a positive number of images, got %d'
                         % (name.replace('_', '-'), value))
    if args.quality is not None:
        lo, hi = (0, 9) if args.format == 'png' else (95, 100)
        if not lo <= args.quality <= hi:
            parser.error('--quality for %s must be in %d..%d, got %d'
                         % (args.format, lo, hi, args.quality))
    return args


def main(argv=None):
    """Entry point; returns the process exit code (0 on success, 1 on a dataset error)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
    if not os.path.isdir(args.src):
        LOG.error('Fashion-MNIST not found: %s does not exist. Install it with `%s` '
                  '(Debian package dataset-fashion-mnist) or pass --src DIR.',
                  args.src, INSTALL_HINT)
        return 1
    os.makedirs(args.out, exist_ok=True)
    limits = {'train': args.max_train, 'val': args.max_val}
    img_fmt = '.' + args.format
    try:
        for split in ('train', 'val'):
            rec_path = os.path.join(args.out, split + '.rec')
            idx_path = os.path.join(args.out, split + '.idx')
            images, labels = load_split(args.src, split)
            n = len(images) if limits[split] is None else min(limits[split], len(images))
            have = count_records(rec_path, idx_path)
            if have == n and not args.force:
                LOG.info('%s: %s already holds %d records, skipping (use --force to rewrite)',
                         split, rec_path, n)
                continue
            LOG.info('%s: writing %d of %d images to %s', split, n, len(images), rec_path)
            write_split(images[:n], labels[:n], rec_path, idx_path, img_fmt=img_fmt,
                        quality=args.quality, progress=not args.no_progress)
            counts = np.bincount(labels[:n], minlength=NUM_CLASSES)
            LOG.info('%s: wrote %d records (%d bytes); images per class %s', split, n,
                     os.path.getsize(rec_path), counts.tolist())
    except DatasetError as err:
        LOG.error('%s', err)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
