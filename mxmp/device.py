"""What the hardware can run: a probe for low-precision kernels.

MXNet 1.9.1 has float16 Convolution/FullyConnected only on NVIDIA GPUs ("FP16 gemm on cpu not
implemented!"), and bfloat16 ones only through oneDNN on CPUs with AVX-512 (oneDNN 2.x needs
``avx512_core`` for bfloat16; on an AVX2-only CPU a bfloat16 Convolution fails with "could not
create a primitive descriptor iterator", measured on the project's AMD EPYC AVX2 machines).
Where the kernels are missing, ``emulate=True`` runs the same numerics with float32 kernels.
"""
import contextlib
import functools
import os

from .policy import normalize_dtype

__all__ = ['lp_kernels_available', 'MISSING_KERNEL_MESSAGE']

#: The MXNet error text of a missing oneDNN low-precision kernel.
MISSING_KERNEL_MESSAGE = 'could not create a primitive descriptor'


@contextlib.contextmanager
def _quiet_stderr():
    """Silence MXNet's C++ log lines (written to fd 2) while a probe fails on purpose."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, 'w') as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def lp_kernels_available(target_dtype, ctx=None):
    """Whether ``ctx`` runs Convolution and FullyConnected in ``target_dtype``.

    The answer comes from running a 1x1 Convolution and a FullyConnected (forward and backward)
    on tiny arrays once per (dtype, context); it is cached.

    Args:
        target_dtype (str): ``'float16'`` or ``'bfloat16'``.
        ctx (mxnet.Context): default ``mx.cpu()``.

    Returns:
        bool: False for float16 on a CPU, and for bfloat16 on a CPU without oneDNN's
        bfloat16 kernels; then use ``emulate=True`` (or float32).

    Raises:
        ValueError: unknown dtype.
    """
    import mxnet as mx
    ctx = ctx or mx.cpu()
    return _probe(normalize_dtype(target_dtype), ctx.device_type, ctx.device_id)


@functools.lru_cache(maxsize=None)
def _probe(dtype, device_type, device_id):
    import mxnet as mx
    from mxnet import autograd, nd
    if dtype == 'float16' and device_type != 'gpu':
        return False
    ctx = mx.Context(device_type, device_id)
    if dtype == 'bfloat16':
        from mxnet.contrib.amp.amp import bfloat16 as target
    else:
        target = 'float16'
    try:
        with _quiet_stderr():
            x = nd.amp_cast(nd.ones((2, 8, 4, 4), ctx=ctx), dtype=target)
            w = nd.amp_cast(nd.ones((8, 8, 1, 1), ctx=ctx), dtype=target)
            fw = nd.amp_cast(nd.ones((4, 128), ctx=ctx), dtype=target)
            for a in (x, w, fw):
                a.attach_grad()
            with autograd.record():
                y = nd.Convolution(x, w, kernel=(1, 1), num_filter=8, no_bias=True)
                z = nd.FullyConnected(y, fw, num_hidden=4, no_bias=True)
            z.backward()
            nd.waitall()
            fw.grad.wait_to_read()
    except mx.base.MXNetError:
        return False
    return True
