"""What the device does: whether it has low-precision kernels (:func:`lp_kernels_available`),
and bringing arrays oneDNN reordered back to the default layout (:func:`to_default_layout`).

MXNet 1.9.1 has float16 Convolution/FullyConnected only on NVIDIA GPUs and bfloat16 ones only
through oneDNN on CPUs with AVX-512. Details and measurements: docs/pass.md.
"""
import contextlib
import ctypes
import functools
import os

from .dtypes import mx_dtype, normalize_dtype

__all__ = ['lp_kernels_available', 'MISSING_KERNEL_MESSAGE', 'to_default_layout']

#: MXNet's error text of a missing oneDNN low-precision kernel (bfloat16 Convolution and
#: FullyConnected without AVX-512).
MISSING_KERNEL_MESSAGE = 'could not create a primitive descriptor iterator'


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

    Probed once per (dtype, context) in this process: a 1x1 Convolution and a FullyConnected,
    forward and backward, on tiny arrays of its own (it waits on those only, so errors pending
    from other computations are neither seen nor consumed). Only
    :data:`MISSING_KERNEL_MESSAGE` means "no kernels"; the answer is cached.

    Args:
        target_dtype (str): ``'float16'`` or ``'bfloat16'``.
        ctx (mxnet.Context): default ``mx.cpu()``.

    Returns:
        bool: False for float16 on a CPU, for bfloat16 on a CPU without oneDNN's bfloat16
        kernels (oneDNN 2.x needs AVX-512; with ``DNNL_MAX_CPU_ISA=AVX2`` too), and for a GPU
        that cannot run the probe; then use ``emulate=True`` (or float32).

    Raises:
        ValueError: unknown dtype.
        mxnet.base.MXNetError: the probe failed on a CPU for another reason than a missing
            kernel (not cached: the next call probes again).
    """
    import mxnet as mx
    ctx = ctx or mx.cpu()
    return _probe(normalize_dtype(target_dtype), ctx.device_type, ctx.device_id)


@functools.lru_cache(maxsize=None)
def _probe(dtype, device_type, device_id):
    """The cached answer; an exception (an error that is not about kernels) is not cached."""
    import mxnet as mx
    from mxnet import autograd, nd
    if dtype == 'float16' and device_type != 'gpu':
        return False
    ctx = mx.Context(device_type, device_id)
    target = mx_dtype(dtype)
    try:
        with _quiet_stderr(), autograd.pause():
            x = nd.amp_cast(nd.ones((2, 8, 4, 4), ctx=ctx), dtype=target)
            w = nd.amp_cast(nd.ones((8, 8, 1, 1), ctx=ctx), dtype=target)
            fw = nd.amp_cast(nd.ones((4, 128), ctx=ctx), dtype=target)
            for a in (x, w, fw):
                a.attach_grad()
            with autograd.record():
                y = nd.Convolution(x, w, kernel=(1, 1), num_filter=8, no_bias=True)
                z = nd.FullyConnected(y, fw, num_hidden=4, no_bias=True)
            z.backward()
            # Each of the probe's own results is waited on, also after one fails (never
            # nd.waitall()): an error left pending would surface in the user's next wait.
            errors = []
            for a in (y, z, x.grad, w.grad, fw.grad):
                try:
                    a.wait_to_read()
                except mx.base.MXNetError as err:
                    errors.append(err)
            if errors:
                raise errors[0]
    except mx.base.MXNetError as err:
        if device_type == 'gpu' or MISSING_KERNEL_MESSAGE in str(err):
            return False
        raise
    return True


def to_default_layout(arrays):
    """Reorder each CPU NDArray that oneDNN holds in a blocked layout back to the default one,
    in place (same objects, values, shape, dtype), through the C API's ``MXNDArrayGetData``.

    An inference Convolution leaves its weight in oneDNN's blocked layout, where ``amp_cast``
    fails for grouped weights (docs/pass.md). Default-layout, sparse and GPU arrays are left
    alone; each CPU array is waited on first.

    Args:
        arrays (NDArray or iterable of NDArray, None entries allowed): the arrays.

    Raises:
        mxnet.base.MXNetError: a pending computation that writes one of the arrays failed
            (raised by ``wait_to_read``; the error is that computation's, not this function's).
    """
    from mxnet import nd
    from mxnet.base import _LIB, check_call
    if isinstance(arrays, nd.NDArray):
        arrays = (arrays,)
    pointer = ctypes.c_void_p()
    for arr in arrays:
        if arr is None or arr.stype != 'default' or arr.context.device_type == 'gpu':
            continue
        arr.wait_to_read()
        check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(pointer)))
