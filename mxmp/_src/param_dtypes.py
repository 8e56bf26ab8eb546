"""Parameters that ``cast_params`` stores in the target dtype, as a state mxmp owns and undoes.

``mxmp.convert(..., cast_params=True)`` stores the weights of low-precision layers in bfloat16
or float16 (:func:`mxmp._src.gluon_graph.cast_to_graph`, which records each Parameter's dtype
before, ``STORED_FROM``). MXNet 1.9.1 cannot take such Parameters everywhere, so the hook
module (:mod:`mxmp._src.gluon`) routes these calls here:

- :func:`restore_dtypes` (``mxmp.remove_hooks``): every such Parameter back in its former dtype,
  from the Trainer's float32 master weight where one is kept, else the float32 values from
  before the cast where still held, else its stored values widened exactly.
- :func:`initialize` (``Parameter.initialize``): MXNet's initializers write float16, float32
  or float64 only ("Output type must be float16, float32, float64: dtype is 12" for
  bfloat16): the Parameter is initialized in float32, then stored in its dtype again; a
  Trainer's master weight becomes the new float32 value.
- :func:`zero_grad` (``ParameterDict.zero_grad``): MXNet zeroes the gradients with
  ``reset_arrays``, which has no bfloat16 kernel ("Unknown type enum 12"); gradients in a
  dtype it lacks are zeroed with ``zeros_like(out=)`` (what ``Parameter.zero_grad`` does).
- :func:`check_unconverted`: a block mxmp did not convert that reads such a Parameter (it is
  shared with a converted network) would fail inside MXNet ("(12 vs. 0)"): RuntimeError
  naming the fix first.
"""
import mxnet as mx
from mxnet import autograd

from .device import to_default_layout
from .dtypes import dtype_name
from .graph.convert import convert_symbol
from .gluon_graph import (_DEFERRED_CASTS, STORED_FROM, _cast_parameter, cast_to_graph,
                          unrounded_values)
from .training.master_weights import master_value, set_master_value

__all__ = ['cast_params_now', 'restore_dtypes', 'initialize', 'zero_grad', 'check_unconverted']

#: dtypes MXNet 1.9.1's ``reset_arrays`` zeroes (``MSHADOW_TYPE_SWITCH`` without bfloat16).
_RESETTABLE = ('float32', 'float64', 'float16', 'uint8', 'int8', 'int32', 'int64')


def cast_params_now(block, policy):
    """Store the weights ``policy`` (``cast_params=True``) stores in low precision now, found
    on ``block`` (a HybridBlock) traced with one input ``data`` (else at its first graph), so
    that what runs before the first call sees their final dtypes."""
    try:
        out = block(mx.sym.var('data'))
        sym = mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
        converted = convert_symbol(sym, policy=policy)
    except Exception:  # pylint: disable=broad-except  (other inputs: cast at the first call)
        return
    cast_to_graph(block.collect_params(), converted)


def restore_dtypes():
    """Give every Parameter mxmp stored in another dtype its former dtype back (arrays and
    gradients, every device), with the most exact float32 values available (module
    docstring). Deferred casts not yet made are dropped."""
    _DEFERRED_CASTS.clear()
    for param, dtype in list(STORED_FROM.items()):
        del STORED_FROM[param]
        if param._data is None or dtype_name(param.dtype) == dtype_name(dtype):
            param._dtype = dtype
            continue
        master, unrounded = master_value(param), unrounded_values(param)
        with autograd.pause():
            to_default_layout(param._data)  # amp_cast fails on weights oneDNN reordered
            ctxs = [d.context for d in param._data]
            if master is not None:
                data = [master.as_in_context(c).astype(dtype) for c in ctxs]
            elif unrounded is not None:
                data = [u.astype(dtype) for u in unrounded]
            else:
                data = [mx.nd.amp_cast(d, dtype=dtype) for d in param._data]
            param._dtype = dtype
            param._data = data
            if param._grad is not None:
                param._grad = [mx.nd.amp_cast(g, dtype=dtype) for g in param._grad]
                autograd.mark_variables(param._data, param._grad, param.grad_req)
            for array in param._data + (param._grad or []):
                array.wait_to_read()   # an error surfaces here, not in a later call
        param._var = None   # a graph traced from now on declares the restored dtype


def initialize(param, original, init=None, ctx=None, default_init=mx.init.Uniform(),
               force_reinit=False):
    """``Parameter.initialize`` (``original``, MXNet's, with its arguments) for a Parameter
    mxmp stores in the target dtype: initialized in float32 (deferred or not), then stored in
    its dtype again, rounded to nearest even; a Trainer's master weight takes the float32
    value. Other Parameters: MXNet's call unchanged."""
    if param not in STORED_FROM or dtype_name(param.dtype) == dtype_name(STORED_FROM[param]):
        return original(param, init, ctx, default_init, force_reinit)
    if param._data is not None and not force_reinit:   # MXNet's warning, nothing changes
        return original(param, init, ctx, default_init, force_reinit)
    stored = param.dtype
    param._dtype = STORED_FROM[param]
    try:
        original(param, init, ctx, default_init, force_reinit)
    except BaseException:
        param._dtype = stored
        raise
    if param._data is not None:
        set_master_value(param, param._data[0])
    _cast_parameter(param, stored)   # deferred: once MXNet has the shape (cast_deferred)
    return None


def zero_grad(params, original):
    """``ParameterDict.zero_grad`` (``original``, MXNet's) for ``params`` holding gradients in
    a dtype MXNet's ``reset_arrays`` lacks (bfloat16): those are zeroed one by one, the others
    by MXNet's call on the same dict with them held aside."""
    odd = [p for p in params.values() if p.grad_req != 'null' and p._grad is not None and
           dtype_name(p._grad[0].dtype) not in _RESETTABLE]
    if not odd:
        return original(params)
    held = {}
    try:
        for p in odd:
            for g in p._grad:
                mx.nd.zeros_like(g, out=g)
            held[p] = p._grad
            p._grad = None   # MXNet's zero_grad skips a Parameter without gradient arrays
        return original(params)
    finally:
        for p, grads in held.items():
            p._grad = grads


def check_unconverted(block, params):
    """Raise RuntimeError if ``block`` (not converted by mxmp) reads one of ``params`` that
    mxmp stores in a low-precision dtype (a Parameter shared with a network converted with
    ``cast_params=True``): MXNet would fail on it inside its graph. The message names the fix.
    """
    low = [p for p in params if p in STORED_FROM and
           dtype_name(p.dtype) != dtype_name(STORED_FROM[p]) == 'float32']
    if low:
        raise RuntimeError(
            '%s is not converted by mxmp, but reads Parameter(s) %s, which a network converted '
            'with cast_params=True shares and stores in %s: it would fail on them in float32. '
            'Convert %s too (mxmp.convert(%s, ...), with the same settings), convert the '
            'other network with cast_params=False, or call mxmp.remove_hooks() to have the '
            'float32 weights back.' % (block.name, ', '.join(p.name for p in low[:3]),
                                       dtype_name(low[0].dtype), block.name, block.name))
