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

from .dtypes import normalize_dtype

__all__ = ['lp_kernels_available', 'MISSING_KERNEL_MESSAGE']

#: The MXNet error text of a missing oneDNN low-precision kernel (measured with
#: ``DNNL_MAX_CPU_ISA=AVX2``: bfloat16 Convolution and FullyConnected both raise it, from
#: mkldnn_convolution.cc and mkldnn_fully_connected.cc).
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

    The answer comes from running a 1x1 Convolution and a FullyConnected (forward and backward)
    on tiny fresh arrays once per (dtype, context); a genuine answer is cached for the process.

    The probe cannot be poisoned by other work: it waits only on its own arrays (never
    ``nd.waitall()``), so a failure still pending from another computation (MXNet reports
    errors asynchronously, at the next wait) neither reaches the probe nor is consumed by it;
    the user's next ``waitall`` still raises it. MXNet passes an error only along data
    dependencies: measured with an ``amp_cast`` failing in the background, the probe's own
    ``wait_to_read`` saw nothing while a ``waitall`` raised, and cleared, the unrelated error.
    Only oneDNN's missing-kernel error (:data:`MISSING_KERNEL_MESSAGE`) means "no kernels";
    on a CPU any other error of the probe is raised, not cached. It runs in this process
    (0.03 s) rather than in a subprocess (2.7-4.5 s to start Python and MXNet, measured on a
    2-core machine), and so sees the same MXNet and oneDNN settings (``DNNL_MAX_CPU_ISA`` is
    read once, when MXNet loads) as the computations it answers for.

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
    if dtype == 'bfloat16':
        from mxnet.contrib.amp.amp import bfloat16 as target
    else:
        target = 'float16'
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
            # Only the probe's own results: never nd.waitall(), which would raise (and clear)
            # an error pending from someone else's computation. Every one is waited on, also
            # after the first fails: an error left pending on one of them would be raised by
            # the user's next nd.waitall() (measured with bulk execution off,
            # MXNET_EXEC_BULK_EXEC_TRAIN=0, under DNNL_MAX_CPU_ISA=AVX2: a float32 training
            # step then failed with the probe's "could not create a primitive descriptor").
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
