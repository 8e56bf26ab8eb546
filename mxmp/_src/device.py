"""What the device does: whether it has low-precision kernels (:func:`lp_kernels_available`),
and bringing arrays oneDNN reordered back to the default layout (:func:`to_default_layout`).

MXNet 1.9.1 has float16 Convolution/FullyConnected only on NVIDIA GPUs and bfloat16 ones only
through oneDNN on CPUs with AVX-512. Details and measurements: docs/pass.md.
"""
import contextlib
import ctypes
import functools
import os

import logging

from .dtypes import mx_dtype, normalize_dtype
from .errors import GpuProbeError, mxnet_error_line

__all__ = ['lp_kernels_available', 'MISSING_KERNEL_MESSAGE', 'GPU_MISSING_KERNEL_MESSAGES',
           'gpu_compute_capability', 'tensor_core_note', 'to_default_layout']

logger = logging.getLogger('mxmp.device')

#: MXNet's error text of a missing oneDNN low-precision kernel (bfloat16 Convolution and
#: FullyConnected without AVX-512).
MISSING_KERNEL_MESSAGE = 'could not create a primitive descriptor iterator'
#: MXNet's error texts of an op without a kernel for a dtype on a GPU: mshadow's type switch
#: ("Unknown type enum 12" for bfloat16) and the kernels that refuse a dtype. Any other failure
#: of the probe on a GPU is a GpuProbeError.
GPU_MISSING_KERNEL_MESSAGES = ('Unknown type enum', 'not implemented')


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
        kernels (oneDNN 2.x needs AVX-512; with ``DNNL_MAX_CPU_ISA=AVX2`` too), and on a GPU
        whose ops refuse the dtype (:data:`GPU_MISSING_KERNEL_MESSAGES`); then use
        ``emulate=True`` (or float32).

    Raises:
        ValueError: unknown dtype.
        mxnet.base.MXNetError: the probe failed on a CPU for another reason than a missing
            kernel (not cached: the next call probes again).
        mxmp.GpuProbeError: ``ctx`` is a GPU and MXNet has no CUDA, or the probe failed there
            for another reason than a missing kernel (driver, CUDA libraries, memory): MXNet's
            message is kept; not cached.
    """
    import mxnet as mx
    ctx = ctx or mx.cpu()
    return _probe(normalize_dtype(target_dtype), ctx.device_type, ctx.device_id)


@functools.lru_cache(maxsize=None)
def _probe(dtype, device_type, device_id):
    """The cached answer; an exception (an error that is not about kernels) is not cached."""
    import mxnet as mx
    if dtype == 'float16' and device_type != 'gpu':
        return False
    ctx = mx.Context(device_type, device_id)
    if device_type == 'gpu' and not _cuda_build():
        raise GpuProbeError(
            '%s: this MXNet build has no CUDA (mx.runtime.Features() lists CUDA off), so it '
            'cannot run anything on a GPU. Install the CUDA build (pip install "mxmp[cu112]" '
            'for mxnet-cu112) or use mx.cpu()' % ctx)
    try:
        _run_probe(ctx, mx_dtype(dtype))
    except mx.base.MXNetError as err:
        text = str(err)
        if device_type == 'gpu':
            if any(m in text for m in GPU_MISSING_KERNEL_MESSAGES):
                return False
            raise GpuProbeError(
                '%s failed the %s kernel probe (a 1x1 Convolution and a FullyConnected), not '
                'for want of a kernel: MXNet says: %s. Check the GPU: driver and CUDA libraries '
                '(python -m mxmp._src.cuda), free memory (another process, a momentary '
                'out-of-memory); the next call probes again'
                % (ctx, dtype, mxnet_error_line(err, 500)), text) from err
        if MISSING_KERNEL_MESSAGE in text:
            return False
        raise
    return True


def _cuda_build():
    """bool: whether this MXNet was built with CUDA."""
    import mxnet as mx
    return mx.runtime.Features().is_enabled('CUDA')


def _run_probe(ctx, target):
    """A tiny Convolution and FullyConnected, forward and backward, in ``target`` on ``ctx``;
    raises the first MXNetError of its own arrays."""
    import mxnet as mx
    from mxnet import autograd, nd
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


def gpu_compute_capability(device_id):
    """``(major, minor)`` of NVIDIA GPU ``device_id`` from the CUDA runtime that mxnet-cu112
    links (``cudaDeviceGetAttribute``), or None where it cannot be asked (no CUDA runtime)."""
    try:
        runtime = ctypes.CDLL('libcudart.so.11.0')
        major, minor = ctypes.c_int(), ctypes.c_int()
        # cudaDevAttrComputeCapabilityMajor = 75, ...Minor = 76 (cuda_runtime_api.h)
        if runtime.cudaDeviceGetAttribute(ctypes.byref(major), 75, int(device_id)) or \
                runtime.cudaDeviceGetAttribute(ctypes.byref(minor), 76, int(device_id)):
            return None
    except (OSError, AttributeError):
        return None
    return major.value, minor.value


#: Tensor Cores, which run float16 matrix products several times faster than float32, came
#: with compute capability 7.0 (Volta); Pascal (6.x) runs float16 on its ordinary units.
TENSOR_CORE_CAPABILITY = (7, 0)


@functools.lru_cache(maxsize=None)
def tensor_core_note(device_id, capability=None):
    """Say once (a logged warning, returned too) that float16 on GPU ``device_id`` runs
    without Tensor Cores when its compute capability (``capability``, default asked with
    :func:`gpu_compute_capability`) is below 7.0; None otherwise or when unknown."""
    capability = capability or gpu_compute_capability(device_id)
    if capability is None or tuple(capability) >= TENSOR_CORE_CAPABILITY:
        return None
    note = ('gpu(%d) has compute capability %d.%d (Pascal or older): it runs float16 without '
            'Tensor Cores (compute capability 7.0+), so float16 halves activation and weight '
            'memory but matrix products gain little or nothing over float32 (on most Pascal '
            'cards other than the P100 float16 arithmetic is far slower than float32)'
            % ((device_id,) + tuple(capability)))
    logger.warning('mxmp: %s', note)
    return note


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
