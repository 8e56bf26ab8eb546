"""The root-rank broadcast of initial weights: every worker starts from one worker's values.

Data-parallel training needs every worker to start from the same weights (Horovod's
``broadcast_parameters``; gluon.Trainer pulls worker 0's values from a dist kvstore). mxmp
does it once, here, for :class:`mxmp.Trainer` on a dist kvstore
(:mod:`mxmp._src.distributed.kvstore`), :class:`mxmp._src.horovod.DistributedTrainer` and
:class:`mxmp.Module`; the backend that moves the bytes is the caller's.

Each weight travels as a fresh copy in its *wire dtype*, never as the live array: bfloat16
would abort a dist kvstore's parameter server and Horovod has no bfloat16 (float32 travels
instead, :func:`mxmp._src.distributed.exchange.wire_dtype`), and a weight a forward pass left in
oneDNN's blocked layout is brought back to the default layout first (``amp_cast`` and the
kvstore fail on it, :mod:`mxmp._src.device`). The values are then cast back into every device's
array, and the broadcast is waited for before returning, so that no gradient is pushed on a
key whose weight pull is still pending (on a dist kvstore the server's value of a key becomes
the gradient sum after a round: a late pull would write the summed gradient into the weight).
"""
from mxnet import autograd, nd

from ..dtypes import dtype_name, mx_dtype
from ..device import to_default_layout

__all__ = ['broadcast_from_root']


def broadcast_from_root(entries, send, wire_dtype=None):
    """Overwrite every weight with the root worker's value, in place, and wait for it.

    Args:
        entries (iterable of (key, list of NDArray)): a weight's key for the backend (a
            kvstore key, a Horovod tensor name) and its arrays, one per device (all holding
            the same value; the first is sent).
        send (callable): ``send(key, wire)`` replaces the value of the NDArray ``wire`` in
            place with the root's value of ``key`` (e.g. ``kv.init(key, wire); kv.pull(key,
            out=wire)``, or ``hvd.broadcast_(wire, root_rank, name=key)``).
        wire_dtype (callable or None): own dtype name -> the dtype name the weight travels in
            (default: its own dtype).

    Returns:
        list: the keys broadcast, in order.

    Cost: one copy (and cast) per weight, the backend's transfer, one cast per device array;
    one host synchronisation per weight (the wait).
    """
    done = []
    for key, arrays in entries:
        own = dtype_name(arrays[0].dtype)
        dtype = own if wire_dtype is None else wire_dtype(own)
        with autograd.pause():
            to_default_layout(arrays[0])
            wire = nd.amp_cast(arrays[0], dtype=mx_dtype(dtype)) if dtype != own \
                else arrays[0].copy()
            send(key, wire)
            for arr in arrays:
                nd.amp_cast(wire.as_in_context(arr.context), dtype=arr.dtype, out=arr)
            for arr in arrays:
                arr.wait_to_read()
        done.append(key)
    return done
