"""Worker of tests/kernels/test_batch_dot_kernel.py: runs ``mxmp_batch_dot`` (forward and
backward, float32 and bfloat16) in its own process, so that ``DNNL_MAX_CPU_ISA`` set by the
test reaches the library before it loads. Prints one JSON line: per case the relative errors
against the float64 reference, the dtypes of the output and gradients, and an md5 of their
bits."""
import hashlib
import json

import numpy as np

import mxnet as mx
from mxnet.contrib.amp.amp import bfloat16

import mxmp  # noqa: F401 (loads the library)
from mxmp._src.conformance.attention import reference, round_bf16
from mxmp._src.kernels.build import load_library

#: (shape of a, shape of b, transpose_a, transpose_b): odd sizes (tile edges), 4-D, k odd
CASES = [((3, 9, 20), (3, 20, 37), False, False),
         ((3, 9, 21), (3, 37, 21), False, True),
         ((2, 2, 21, 17), (2, 2, 21, 40), True, False),
         ((3, 20, 33), (3, 5, 20), True, True)]


def _np(a):
    return (mx.nd.amp_cast(a, dtype='float32') if a.dtype != np.float32 else a).asnumpy()


def main():
    load_library()
    rows = []
    for seed, (sa, sb, ta, tb) in enumerate(CASES):
        rng = np.random.RandomState(seed)
        a, b = round_bf16(rng.normal(size=sa)), round_bf16(rng.normal(size=sb))
        out_shape = mx.nd.batch_dot(mx.nd.array(a), mx.nd.array(b), transpose_a=ta,
                                    transpose_b=tb).shape
        og = round_bf16(rng.normal(size=out_shape))
        ref = reference('batch_dot', [a, b], og, (ta, tb))
        row = {'shapes': [sa, sb], 'transpose': [ta, tb]}
        for dtype in ('float32', 'bfloat16'):
            cast = (lambda x: mx.nd.array(x)) if dtype == 'float32' else \
                (lambda x: mx.nd.amp_cast(mx.nd.array(x), dtype=bfloat16))
            x, y = cast(a), cast(b)
            x.attach_grad()
            y.attach_grad()
            with mx.autograd.record():
                out = mx.nd.mxmp_batch_dot(x, y, transpose_a=ta, transpose_b=tb)
            out.backward(cast(og))
            got = [out, x.grad, y.grad]
            row[dtype] = {
                'err': [float(np.abs(_np(g) - r).max() / np.abs(r).max())
                        for g, r in zip(got, ref)],
                'dtypes': ['bfloat16' if np.dtype(g.dtype).names else np.dtype(g.dtype).name
                           for g in got],
                'md5': hashlib.md5(b''.join(g.asnumpy().tobytes() for g in got)).hexdigest()}
        # MXNet's float32 batch_dot on the same values, for scale
        x, y = mx.nd.array(a), mx.nd.array(b)
        x.attach_grad()
        y.attach_grad()
        with mx.autograd.record():
            out = mx.nd.batch_dot(x, y, transpose_a=ta, transpose_b=tb)
        out.backward(mx.nd.array(og))
        row['mxnet_float32_err'] = [float(np.abs(g.asnumpy() - r).max() / np.abs(r).max())
                                    for g, r in zip([out, x.grad, y.grad], ref)]
        rows.append(row)
    print(json.dumps({'rows': rows}))


if __name__ == '__main__':
    main()
