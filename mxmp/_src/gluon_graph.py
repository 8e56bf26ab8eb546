"""What happens when Gluon builds or runs the graph of a network in mixed precision.

:mod:`mxmp._src.gluon` hooks MXNet's graph cache; this module is the work done there, without any
hook of its own:

* :class:`Conversion` -- the settings a network is converted with (frozen data): the
  :class:`mxmp.Policy`, ``cast_params``, ``emulate``, ``fuse_inference``, ``pad_stem``.
* :func:`rewrite` -- the graph pass applied to the float32 graph MXNet just traced for a block,
  with that call's inputs: their dtypes, the context (kernels or emulation), the data shapes
  (stem padding), the Parameters the graph stores in the target dtype (cast then).
* :class:`BuiltGraph` -- the state of one built graph: the grouped weights to bring back to
  oneDNN's default layout before each call, and the oneDNN-fused twin for inference.
"""
import dataclasses
import logging
import os
import weakref
from typing import Union

import mxnet as mx
from mxnet import autograd

from .device import lp_kernels_available
from .dtypes import dtype_name, from_mshadow_enum, mx_dtype
from .fusion import FusedInference
from .graph.convert import convert_symbol
from .graph.strip import count_casts
from .graph.stem import pad_stem as pad_stem_of, padded_convolutions, wants_padding
from .graph.symbol_json import CAST_OPS, cast_param_names, load
from .layout import to_default_layout
from .policy.policy import Policy

__all__ = ['Conversion', 'rewrite', 'BuiltGraph', 'unrounded_values']

logger = logging.getLogger('mxmp.gluon')

# Parameter -> its float32 arrays from before cast_params rounded it to the target dtype
# (one per device). mxmp.Trainer makes the master weights from these, not from the rounded
# values (unrounded_values). Keyed by the Parameter object itself, weakly.
_UNROUNDED = weakref.WeakKeyDictionary()

_EMULATION_SAID = set()   # (dtype, context) pairs already logged


@dataclasses.dataclass(frozen=True)
class Conversion:
    """How a network is converted (see :func:`mxmp.convert` for each field).

    Attributes:
        policy (mxmp.Policy): target dtype and op classes.
        cast_params (bool): low-precision layers' weights stored in the target dtype.
        emulate ('auto' or bool): 'auto': emulate where the call's context has no kernels.
        fuse_inference ('auto' or bool): oneDNN-fused graph for inference calls on a CPU.
        pad_stem ('auto' or bool): pad an odd-channel NCHW stem by one zero channel.
    """
    policy: Policy
    cast_params: bool = False
    emulate: Union[str, bool] = 'auto'
    fuse_inference: Union[str, bool] = 'auto'
    pad_stem: Union[str, bool] = 'auto'

    @property
    def target_dtype(self):
        """str: ``'bfloat16'`` or ``'float16'``."""
        return self.policy.target_dtype

    def policy_on(self, ctx):
        """The policy for a graph that runs on ``ctx`` (mx.Context), emulation decided.

        Raises:
            RuntimeError: ``emulate=False`` and ``ctx`` has no kernels for the target dtype.
        """
        dtype = self.target_dtype
        if self.emulate == 'auto':
            emulate = self.policy.emulate or not lp_kernels_available(dtype, ctx)
            if emulate and not self.policy.emulate and (dtype, str(ctx)) not in _EMULATION_SAID:
                _EMULATION_SAID.add((dtype, str(ctx)))
                logger.warning('mxmp: %s has no %s kernels; the network emulates %s numerics '
                               'with float32 kernels (same results, float32 speed)',
                               ctx, dtype, dtype)
            return self.policy.replace(emulate=emulate) if emulate != self.policy.emulate \
                else self.policy
        if not self.emulate and not self.policy.emulate and not lp_kernels_available(dtype, ctx):
            # Checked up front: MXNet would fail asynchronously, far from the cause.
            raise RuntimeError(
                '%s has no %s kernels (oneDNN needs AVX-512 for bfloat16; CPUs have no float16 '
                'GEMM). Convert with emulate=True (or the default emulate=\'auto\') to run the '
                'same numerics with float32 kernels.' % (ctx, dtype))
        if self.emulate and not self.policy.emulate:
            return self.policy.replace(emulate=True)
        return self.policy


def _context(args):
    for a in args:
        if isinstance(a, mx.nd.NDArray):
            return a.context
    return mx.current_context()


def rewrite(block, conversion, inputs, sym, args, ctx=None):
    """The mixed-precision graph of ``block`` for the graph MXNet just traced.

    Args:
        block (gluon.HybridBlock): the block whose graph it is (its Parameters).
        conversion (Conversion): the settings.
        inputs (list of Symbol): the graph's data variables, in call order (``data`` or
            ``data0``, ``data1``, ...: MXNet's names).
        sym (Symbol): the float32 graph MXNet traced.
        args (tuple): the call's inputs (NDArrays, possibly nested; None for absent ones);
            empty for a SymbolBlock converted before its first call (float32 inputs, or the
            ``__dtype__`` of its input variables).
        ctx (mx.Context): where it runs; default: the inputs' context, else the current one.

    Returns:
        BuiltGraph: the converted Symbol and its per-call state. Parameters the graph stores
        in the target dtype (``cast_params=True``) are cast now; their float32 values are kept
        for the master weights (:func:`unrounded_values`).
    """
    from mxnet.gluon.block import _flatten
    flat = [a for a in _flatten(args, 'input')[0] if a is not None]
    ctx = ctx or _context(flat)
    policy = conversion.policy_on(ctx)
    names = tuple(s.name for s in inputs)
    dtypes = {s.name: from_mshadow_enum(s.attr('__dtype__'))
              for s in inputs if s.attr('__dtype__')}
    dtypes.update({n: a.dtype for n, a in zip(names, flat) if isinstance(a, mx.nd.NDArray)})
    shapes = {n: a.shape for n, a in zip(names, flat) if isinstance(a, mx.nd.NDArray)}
    converted = convert_symbol(sym, policy=policy, data_dtypes=dtypes,
                               cast_params=conversion.cast_params, data_names=names)
    if shapes and wants_padding(conversion.pad_stem, policy, ctx):
        converted = pad_stem_of(converted, shapes)
    params = block.collect_params()
    lp_names = cast_param_names(converted)
    # Every Parameter takes the dtype the converted graph declares for its variable: the target
    # dtype where cast_params stores it so (rounded), float32 where the pass stores a Parameter
    # that arrived in low precision (net.cast('bfloat16') first) in float32 -- a float32 op that
    # needs it as a graph variable (Deconvolution's weight) or an emulated graph -- (widened
    # exactly).
    for node in load(converted)['nodes']:
        declared = from_mshadow_enum(node.get('attrs', {}).get('__dtype__')) \
            if node['op'] == 'null' else None
        param = params[node['name']] if declared and node['name'] in params.keys() else None
        if param is not None and dtype_name(param.dtype) != declared:
            _cast_parameter(param, mx_dtype(declared))
    logger.info('mxmp: %s graph in %s%s: %d casts, %d parameters stored in %s', block.name,
                policy.target_dtype, ' (emulated)' if policy.emulate else '',
                count_casts(converted)['amp_cast'], len(lp_names), policy.target_dtype)
    built = BuiltGraph(block, conversion, policy, sym, converted, names, dtypes)
    built.unrounded = [params[n] for n in lp_names if n in params]
    return built


class BuiltGraph:
    """One graph MXNet built for a converted block, and what each call of it needs.

    Attributes:
        symbol (Symbol): the converted graph (what the block's CachedOp runs).
        float32_symbol (Symbol): the graph MXNet traced, before the pass.
        policy (mxmp.Policy): the policy it was converted with (emulation decided).
        fused (FusedInference or None): the oneDNN-fused inference twin (built at first use).
    """

    def __init__(self, block, conversion, policy, float32_symbol, symbol, data_names,
                 data_dtypes):
        self.conversion = conversion
        self.policy = policy
        self.float32_symbol = float32_symbol
        self.symbol = symbol
        self._data_names = data_names
        self._data_dtypes = data_dtypes
        params = block.collect_params()
        grouped = _grouped_weights_cast_in_graph(symbol)
        self._grouped = [p for n, p in params.items() if n in grouped]
        self.fused = None
        self.unrounded = []   # Parameters whose float32 values _UNROUNDED may still hold
        if conversion.fuse_inference is not False:
            precast = None
            if not conversion.cast_params and not policy.emulate:
                precast = self._precast
            self.fused = FusedInference(block, precast)

    def _precast(self, args):
        """The fused graph's own graph: weights taken in the target dtype (see mxmp._src.fusion)."""
        graph = convert_symbol(self.float32_symbol, policy=self.policy,
                               data_dtypes=self._data_dtypes, cast_params=True,
                               data_names=self._data_names)
        if padded_convolutions(self.symbol):
            graph = pad_stem_of(graph, {n: a.shape for n, a in zip(self._data_names, args)})
        return graph, cast_param_names(graph), mx_dtype(self.policy.target_dtype)

    def fuses(self, ctx):
        """bool: whether an inference call on ``ctx`` runs the fused graph."""
        option = self.conversion.fuse_inference
        if self.fused is None or autograd.is_training() or ctx.device_type != 'cpu':
            return False
        if option == 'auto':
            # MXNET_SUBGRAPH_BACKEND=NONE turns MXNet's own fusion off: 'auto' follows it.
            return not self.policy.emulate and \
                os.environ.get('MXNET_SUBGRAPH_BACKEND', '').upper() != 'NONE' and \
                lp_kernels_available(self.policy.target_dtype, ctx)
        return bool(option)

    def before_call(self, ctx, recording):
        """Work before each call on ``ctx``: grouped weights back to the default layout; at the
        first call outside ``autograd.record()`` (inference before any training step), the
        float32 values kept for master weights are dropped (inference needs no masters)."""
        if not recording and self.unrounded:
            for param in self.unrounded:
                _UNROUNDED.pop(param, None)
            self.unrounded = []
        # A float32 inference forward (of this block before conversion, or of another block
        # sharing these Parameters) may have left a weight in oneDNN's blocked layout, where
        # the graph's amp_cast fails for grouped convolutions (mxmp/layout.py).
        arrays = []
        for param in self._grouped:
            if param._data is not None:
                try:
                    arrays.append(param.data(ctx))
                except RuntimeError:
                    pass
        to_default_layout(arrays)


def _grouped_weights_cast_in_graph(sym):
    """Names of the variables that the converted graph casts (``amp_cast``/``amp_multicast``)
    and that feed, through that cast, the weight input of a grouped Convolution/Deconvolution.

    Only those break on oneDNN's blocked layout (one dimension more than the array, see
    :mod:`mxmp._src.layout`); bringing every cast weight back on every call would put a host sync per
    weight on the training path for nothing (dense weights' blocked layouts cast fine).
    """
    nodes = load(sym)['nodes']
    casts = {nid: {i for i, _, _ in n['inputs'] if nodes[i]['op'] == 'null'}
             for nid, n in enumerate(nodes) if n['op'] in CAST_OPS}
    names = set()
    for n in nodes:
        if n['op'] in ('Convolution', 'Deconvolution') and \
                int(n.get('attrs', {}).get('num_group', '1')) > 1 and len(n['inputs']) > 1:
            names.update(nodes[i]['name'] for i in casts.get(n['inputs'][1][0], ()))
    return names


def unrounded_values(param):
    """The float32 arrays ``param`` held before ``cast_params`` rounded it, or None.

    Kept from the conversion until a Trainer takes them or the network's first inference call
    (outside ``autograd.record()``) drops them. Taken once (the entry is dropped): :class:`mxmp.Trainer` makes the master weights from
    them, so training starts from the exact float32 weights (a pretrained or fine-tuned model
    keeps them), not from their bfloat16/float16 rounding. None as well when the Parameter's
    value changed since (``set_data``, ``load_parameters``): its rounding no longer matches
    them (one comparison per device, once).
    """
    arrays = _UNROUNDED.pop(param, None)
    if arrays is None or param._data is None or len(arrays) != len(param._data):
        return None
    with autograd.pause():
        for f32, current in zip(arrays, param._data):
            rounded = mx.nd.amp_cast(f32, dtype=current.dtype)
            if (mx.nd.amp_cast(rounded, dtype='float32') !=
                    mx.nd.amp_cast(current, dtype='float32')).sum().asscalar() != 0:
                return None
    return arrays


def _cast_parameter(param, dtype):
    """``Parameter.cast`` with ``amp_cast``, which rounds to nearest even.

    ``NDArray.astype`` to bfloat16 does not round the same way as ``amp_cast`` (the sums of a
    cast conv weight differ in the third digit), and on a weight that oneDNN has reordered it
    gives arrays whose size does not match their oneDNN descriptor. The float32 arrays are
    kept for the master weights (:func:`unrounded_values`).
    """
    if param._data is None:
        # Deferred: MXNet's _build_cache initializes it right after the graph is built, in
        # the dtype the Parameter has then; its initializers cannot fill bfloat16 arrays
        # ("Output type must be float16, float32, float64"), so it is initialized in float32
        # first and cast once MXNet has initialized it (cast_deferred, after _build_cache).
        _DEFERRED_CASTS[param] = dtype
        return
    param._dtype = dtype
    with autograd.pause():
        to_default_layout(param._data)  # amp_cast fails on grouped weights oneDNN reordered
        if dtype_name(param._data[0].dtype) == 'float32':
            _UNROUNDED[param] = list(param._data)
        param._data = [mx.nd.amp_cast(d, dtype=dtype) for d in param._data]
        if param._grad is None:
            return
        param._grad = [mx.nd.amp_cast(g, dtype=dtype) for g in param._grad]
        autograd.mark_variables(param._data, param._grad, param.grad_req)


_DEFERRED_CASTS = weakref.WeakKeyDictionary()   # Parameter -> target dtype, until initialized


def cast_deferred(params):
    """Cast the Parameters among ``params`` whose cast waited for their initialization."""
    for param in params:
        dtype = _DEFERRED_CASTS.get(param)
        if dtype is not None and param._data is not None:
            del _DEFERRED_CASTS[param]
            _cast_parameter(param, dtype)
