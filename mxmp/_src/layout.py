"""oneDNN layouts: bring arrays that oneDNN reordered back to MXNet's default layout.

MXNet 1.9.1's oneDNN Convolution, in an inference forward (outside ``autograd.record()``),
reorders its weight array *in place* into oneDNN's blocked layout and keeps it there, so that
later inference calls skip the reorder (``MKLDNNConvolutionForwardFullFeature`` in
``src/operator/nn/mkldnn/mkldnn_convolution.cc``: "we also need to modify the layout on the
original weight array"). The NDArray keeps its shape and dtype; only its storage changes. For a
grouped or depthwise convolution the blocked layout has one dimension more than the array (the
groups split out: 5-D for a 4-D weight), and MXNet ops that build a oneDNN reorder from the
array's own shape fail on it, asynchronously: ``amp_cast`` and ``reshape`` raise "could not
create a primitive descriptor for a reorder primitive". This is what broke converting depthwise
networks (MobileNet) after a float32 forward, and it happens with and without bfloat16 kernels.

Measured on a depthwise ``Conv2D(16, 3, groups=16, in_channels=16)`` after one float32
inference forward (MXNet 1.9.1, both with avx512_bf16 kernels and with ``DNNL_MAX_CPU_ISA=AVX2``):
``amp_cast(w)`` and ``amp_cast(w.reshape(w.shape))`` fail; ``amp_cast`` of ``w.copy()``,
``w.copyto(ctx)``, ``w.astype('float32', copy=True)``, ``w * 1`` or ``nd.array(w.asnumpy())``
works (new arrays in the default layout). ``w.to_dlpack_for_read()`` fails ("We can't generate
TBlob for MKLDNN data"). The C API's ``MXNDArrayGetData`` reorders the array itself back to the
default layout (``Reorder2DefaultAsync`` then ``WaitToRead``, ``src/c_api/c_api.cc``), values
unchanged, after which ``amp_cast(w)`` works: that keeps the *same* NDArray object, the one that
autograd marked and that a converted block shares with the original, so it is what
:func:`to_default_layout` uses. A later float32 inference forward of the original block
reorders the weight again (measured), so mxmp brings arrays back right before it casts them,
not once. A training forward/backward leaves the weight in the default layout (measured).
"""
import ctypes

from mxnet import nd
from mxnet.base import _LIB, check_call

__all__ = ['to_default_layout']


def to_default_layout(arrays):
    """Reorder each CPU NDArray that oneDNN holds in a blocked layout back to the default one.

    In place: the same NDArray objects, same values, shape and dtype. Arrays already in the
    default layout, sparse arrays and arrays on GPUs are left alone. Each CPU array is
    synchronised (``wait_to_read``) first, so that a pending oneDNN reorder of it has run.

    Args:
        arrays (NDArray or iterable of NDArray, None entries allowed): the arrays.

    Raises:
        mxnet.base.MXNetError: a pending computation that writes one of the arrays failed
            (raised by ``wait_to_read``; the error is that computation's, not this function's).
    """
    if isinstance(arrays, nd.NDArray):
        arrays = (arrays,)
    pointer = ctypes.c_void_p()
    for arr in arrays:
        if arr is None or arr.stype != 'default' or arr.context.device_type == 'gpu':
            continue
        arr.wait_to_read()
        check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(pointer)))
