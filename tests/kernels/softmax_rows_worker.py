"""Worker of tests/kernels/test_softmax_rows.py: ``mxmp_softmax`` with lengths (forward and
backward; float32, float64, bfloat16) on adversarial rows, in its own process (the thread count
and ``DNNL_MAX_CPU_ISA`` come from the test's environment). Prints one JSON line: per case and
dtype the largest error of the finite rows against a numpy float64 reference (the output's
relative to the row's largest probability, the gradient's to the row's largest
p * (|dy| + |sum(dy * p)|), the size of its terms before they cancel), whether every value
beyond a row's length is 0 (output and gradient), whether the output has NaN where MXNet's
softmax has NaN (and nowhere else) within the lengths, the rows with a NaN, and an md5 of the
output and gradient bits (all rows; the finite rows)."""
import hashlib
import json

import numpy as np

import mxnet as mx
from mxnet import autograd
from mxnet.contrib.amp.amp import bfloat16

import mxmp  # noqa: F401 (loads the library)
from mxmp._src.kernels.build import load_library

#: (rows, m): one element; rows below, across and not a multiple of the loops' blocks of 8
#: rows; rows not a whole number of 16- or 8-float vectors; the parallel loops (rows * m from
#: 32768 elements), their rows split across the threads' halves
CASES = [(1, 1), (9, 7), (17, 16), (23, 33), (300, 17), (300, 128), (257, 200)]


def _rows(seed, rows, m):
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(rows, m)) * 4
    lengths = rng.randint(0, m + 4, size=rows)   # beyond m: clipped to m
    fixed = [0, 1, m, max(m - 1, 0), 15, 16, 17, 9]
    lengths[:min(rows, len(fixed))] = fixed[:rows]
    lengths = np.minimum(lengths, m + 3)
    specials = []
    if rows >= 9:
        x[1, 0] = np.nan                   # length 1: the one value NaN
        x[2, :] = -np.inf                  # a whole row of -inf
        x[3, m // 2] = np.inf              # +inf within the length
        x[4, 15:] = np.nan                 # NaN beyond length 15 only (not read)
        x[5, :] = 3e38                     # large values (x - max is 0)
        x[6, :] *= 40                      # exponentials below e^-87 (0)
        x[7, 2] = np.nan                   # NaN within length 17
        specials = [1, 2, 3, 7]
    if rows >= 150:
        x[130, 5] = np.nan                 # in the second thread's half and a later block
        specials.append(130)
    return x, lengths, specials


def _as(a, dtype):
    if dtype == 'bfloat16':
        return mx.nd.amp_cast(mx.nd.array(a, dtype='float32'), dtype=bfloat16)
    return mx.nd.array(a, dtype=dtype)


def _np(a):
    return (mx.nd.amp_cast(a, dtype='float32') if a.dtype == bfloat16 else a).asnumpy()


def _reference(x, dy, lengths):
    """float64 probabilities and gradient of each row over its length, 0 beyond, and the
    gradient's scale: p * (|dy| + |sum(dy * p)|), the size of its terms before they cancel."""
    p, dx, scale = np.zeros_like(x), np.zeros_like(x), np.zeros_like(x)
    for r, n in enumerate(np.minimum(lengths, x.shape[1])):
        if n == 0:
            continue
        e = np.exp(x[r, :n] - x[r, :n].max())
        p[r, :n] = e / e.sum()
        dot = (dy[r, :n] * p[r, :n]).sum()
        dx[r, :n] = p[r, :n] * (dy[r, :n] - dot)
        scale[r, :n] = p[r, :n] * (np.abs(dy[r, :n]) + abs(dot))
    return p, dx, scale


def main():
    load_library()
    out = []
    for seed, (rows, m) in enumerate(CASES):
        x, lengths, specials = _rows(seed, rows, m)
        dy = np.random.RandomState(seed + 100).normal(size=x.shape)
        dy[:, -1] = np.nan if m > 20 else dy[:, -1]   # head gradient beyond lengths unread
        length = mx.nd.array(lengths, dtype='int32')
        case = {'rows': rows, 'm': m}
        for dtype in ('float32', 'float64', 'bfloat16'):
            data, head = _as(x, dtype), _as(dy, dtype)
            # the reference on the values the op sees (bfloat16: x and dy rounded)
            xv, dyv = _np(data).astype(np.float64), _np(head).astype(np.float64)
            p, dx_ref, scale = _reference(xv, dyv, lengths)
            data.attach_grad()
            with autograd.record():
                y = mx.nd.mxmp_softmax(data, length, use_length=True)
            y.backward(head)
            got, grad = _np(y).astype(np.float64), _np(data.grad).astype(np.float64)
            n = np.minimum(lengths, m)
            beyond = np.arange(m)[None, :] >= n[:, None]
            finite = [r for r in range(rows) if r not in specials and n[r] > 0 and
                      np.isfinite(xv[r, :n[r]]).all() and np.isfinite(dyv[r, :n[r]]).all()]
            err_y = max((np.abs(got[r] - p[r]).max() / np.abs(p[r]).max() for r in finite),
                        default=0.0)
            err_dx = max((np.abs(grad[r] - dx_ref[r]).max() / scale[r].max() for r in finite
                          if scale[r].max() > 0), default=0.0)
            # MXNet's softmax with lengths in float32 on the same values: where it has NaN
            # (lengths clipped to m: MXNet reads beyond a row for a longer one)
            want = mx.nd.softmax(mx.nd.array(xv, dtype='float32'),
                                 mx.nd.array(n, dtype='int32'), axis=-1,
                                 use_length=True).asnumpy()
            within = ~beyond
            case[dtype] = {
                'dtypes': [str(np.dtype(y.dtype)) if y.dtype != bfloat16 else 'bfloat16',
                           str(np.dtype(data.grad.dtype)) if data.grad.dtype != bfloat16
                           else 'bfloat16'],
                'err_y': float(err_y), 'err_dx': float(err_dx),
                'beyond_zero_y': bool((got[beyond] == 0).all()),
                'beyond_zero_dx': bool((grad[beyond] == 0).all()),
                'nan_as_mxnet': bool((np.isnan(got[within]) == np.isnan(want[within])).all()),
                'mxnet_beyond_zero': bool((want[beyond] == 0).all()),
                'nan_rows': [int(r) for r in np.flatnonzero(np.isnan(got).any(axis=1))],
                'specials': specials,
                'md5': hashlib.md5(y.asnumpy().tobytes() + data.grad.asnumpy().tobytes())
                .hexdigest(),
                'md5_finite': hashlib.md5(y.asnumpy()[finite].tobytes() +
                                          data.grad.asnumpy()[finite].tobytes()).hexdigest()}
        out.append(case)
    print(json.dumps({'cases': out}))


if __name__ == '__main__':
    main()
