"""``mxmp.convert``: a Gluon HybridBlock in mixed precision, at any time after construction.

The block is traced to a Symbol (``block(mx.sym.var('data'))``), the graph pass rewrites it
(:func:`mxmp.graph.convert_symbol`) and a :class:`ConvertedBlock` (a ``gluon.SymbolBlock``) runs
the result with the *same* ``Parameter`` objects: an update through one block is seen by the
other, the original's initializers and deferred shapes still apply, and ``export()`` works.
Unlike ``mxnet.contrib.amp`` nothing is patched: ``amp.init()`` is not needed before the net
is built, and nothing global changes.
"""
import logging
import os
import warnings

import mxnet as mx
from mxnet import autograd, gluon

from .dtypes import mx_dtype, normalize_dtype
from .graph import convert_symbol, count_casts, remove_casts
from .graph.params import float32_arrays
from .graph.symbol_json import CAST_OPS, cast_param_names, load
from .device import lp_kernels_available
from .layout import to_default_layout
from .fusion import FusedInference, parameters_changed
from .policy import Policy
from .graph.stem import (check_option as check_pad_stem, pad_converted_stem,
                         pad_stem as pad_stem_of, padded_convolutions)

__all__ = ['convert', 'ConvertedBlock', 'dtype_of']

logger = logging.getLogger(__name__)


#: The MXNet dtype object for a dtype name (the old name of :func:`mxmp.dtypes.mx_dtype`).
dtype_of = mx_dtype


class ConvertedBlock(gluon.SymbolBlock):
    """A mixed-precision block made by :func:`mxmp.convert` (a ``gluon.SymbolBlock``).

    Attributes:
        mxmp_policy (mxmp.Policy): the policy it was converted with.
        mxmp_cast_params (bool): whether low-precision parameters are stored in the target dtype.
        mxmp_source (gluon.HybridBlock): the block it was converted from.
        mxmp_fuse_inference ('auto', True or False): when inference calls run the oneDNN-fused
            graph (see :func:`convert`).
    """
    mxmp_policy = None
    mxmp_cast_params = False
    mxmp_source = None
    _mxmp_grouped_cast_weights = ()
    mxmp_fuse_inference = False
    _mxmp_fused = None
    _mxmp_pad_stem = False  # pad_stem option, until the first call (mxmp.graph.stem)

    def forward(self, x, *args):  # pylint: disable=arguments-differ
        if isinstance(x, mx.nd.NDArray) and not self.mxmp_policy.emulate and \
                not lp_kernels_available(self.mxmp_policy.target_dtype, x.ctx):
            # Checked up front: MXNet would fail asynchronously, far from the cause.
            raise RuntimeError(
                '%s has no %s kernels (oneDNN needs AVX-512 for bfloat16; CPUs have no float16 '
                'GEMM). Convert with mxmp.convert(block, %r, emulate=True) to run the same '
                'numerics with float32 kernels.' % (x.ctx, self.mxmp_policy.target_dtype,
                                                    self.mxmp_policy.target_dtype))
        if isinstance(x, mx.nd.NDArray) and self._mxmp_pad_stem is not False:
            pad_converted_stem(self, (x,) + args)  # pad_stem: needs the first call's shapes
            self._mxmp_pad_stem = False
        if isinstance(x, mx.nd.NDArray):
            # A float32 inference forward of the source block (which shares these Parameters)
            # may have left a weight in oneDNN's blocked layout, where the graph's amp_cast
            # fails for grouped convolutions (mxmp/layout.py).
            to_default_layout(_arrays_on(self._mxmp_grouped_cast_weights, x.ctx))
            if autograd.is_recording():
                parameters_changed()  # a training step follows: fused state goes stale
            elif self._mxmp_fuses(x.ctx):
                out = self._mxmp_fused(x, *args)
                if out is not None:
                    return out
        return super().forward(x, *args)

    def _mxmp_fuses(self, ctx):
        """Whether this call runs the fused graph: hybridized inference on a CPU, as chosen."""
        if not self._active or autograd.is_training() or ctx.device_type != 'cpu' or \
                self._mxmp_fused is None or not self.mxmp_fuse_inference:
            return False
        if self.mxmp_fuse_inference == 'auto':
            # MXNET_SUBGRAPH_BACKEND=NONE turns MXNet's own fusion off: 'auto' follows it.
            return not self.mxmp_policy.emulate and \
                os.environ.get('MXNET_SUBGRAPH_BACKEND', '').upper() != 'NONE' and \
                lp_kernels_available(self.mxmp_policy.target_dtype, ctx)
        return True

    def _clear_cached_op(self):
        super()._clear_cached_op()
        if self._mxmp_fused is not None:  # hybridize(), cast(): new flags or dtypes
            self._mxmp_fused.reset()

    @property
    def mxmp_fused_symbol(self):
        """The oneDNN-fused inference Symbol, or None until an inference call has run fused."""
        return None if self._mxmp_fused is None else self._mxmp_fused.symbol

    def export(self, path, epoch=0, remove_amp_cast=True):
        """Write ``path-symbol.json`` and ``path-%04d.params`` (as ``HybridBlock.export``).

        Args:
            path (str): file prefix.
            epoch (int): number in the params file name. Default 0.
            remove_amp_cast (bool): True (default): a float32 model, casts removed and
                low-precision parameters written as float32, that plain MXNet loads. False: the
                mixed-precision graph with its casts and parameters in their stored dtype.

        Raises:
            RuntimeError: the block has not run forward since ``hybridize()``.
        """
        saved = self._cached_op_args
        if not saved and self._active:
            # Only fused inference calls ran: this block's own CachedOp (whose argument list
            # export reads) was never built. Its parameters are the same objects.
            self._cached_op_args = [(False, p) for p in self.collect_params().values()]
        try:
            super().export(path, epoch, remove_amp_cast=False)
        finally:
            self._cached_op_args = saved
        if not remove_amp_cast:
            return
        remove_casts(self._cached_graph[1]).save('%s-symbol.json' % path)
        params_file = '%s-%04d.params' % (path, epoch)
        mx.nd.save(params_file, float32_arrays(mx.nd.load(params_file)))

    def save_parameters(self, filename, deduplicate=False, dtype='float32'):
        """Write the parameters as the original network's checkpoint (each parameter once).

        The keys are the names ``mxmp_source.save_parameters`` writes (``features.0.weight``)
        and the values float32 by default, also for weights stored in bfloat16/float16
        (``cast_params=True``), where the float32 master weights of an :class:`mxmp.Trainer`
        are written if it holds them: the file loads into the float32 network with
        ``net.load_parameters``. See :func:`mxmp.block_params.save_block_parameters`.

        Args:
            filename (str): the file (written atomically).
            deduplicate (bool): as ``gluon.Block.save_parameters``. Default False.
            dtype (str or None): ``'float32'`` (default), ``'bfloat16'``, ``'float16'``, or None
                for each parameter's stored dtype.

        Raises:
            ValueError: unknown ``dtype``.
        """
        from .block_params import save_block_parameters
        save_block_parameters(self, filename, deduplicate=deduplicate, dtype=dtype)

    def load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False,
                        cast_dtype=False, dtype_source='current'):
        """Load a checkpoint of the original network (float32 or not) into this block.

        Accepts ``net.save_parameters`` files of the float32 network, files of
        :meth:`save_parameters`, ``export`` files and ``collect_params().save`` files. Values
        are cast to each parameter's stored dtype; master weights an :class:`mxmp.Trainer`
        keeps are set to the file's float32 values. Arguments as
        ``gluon.Block.load_parameters``; see :func:`mxmp.block_params.load_block_parameters`.

        Raises:
            mxmp.block_params.ParameterFileError: (ValueError and AssertionError) a missing
                or unknown parameter, without ``allow_missing``/``ignore_extra``.
            ValueError: ``dtype_source='saved'``.
        """
        from .block_params import load_block_parameters
        load_block_parameters(self, filename, ctx=ctx, allow_missing=allow_missing,
                              ignore_extra=ignore_extra, cast_dtype=cast_dtype,
                              dtype_source=dtype_source)

    @property
    def mxmp_symbol(self):
        """The converted Symbol, casts included."""
        return self._cached_graph[1]


def _trace(block, data_names, data_dtypes):
    inputs = [mx.sym.var(n, dtype=mx_dtype(normalize_dtype((data_dtypes or {}).get(n, 'float32'),
                                                          allow_float32=True)))
              for n in data_names]
    try:
        out = block(*inputs)
    except Exception as err:  # any failure of hybrid_forward on Symbols
        raise TypeError(
            'mxmp.convert could not trace %s (%s) into a Symbol: %s: %s. Its hybrid_forward must '
            'use only F.* operators that exist for Symbols (no asnumpy(), no shape-dependent '
            'Python control flow); if it takes more than one input, pass their names as '
            'data_names=(...).' % (block.name, type(block).__name__, type(err).__name__, err)
        ) from err
    if isinstance(out, (list, tuple)):
        out = mx.sym.Group(list(out))
    return inputs, out


def convert(block, target_dtype='bfloat16', cast_params=False, emulate=False, policy=None,
            data_names=('data',), data_dtypes=None, fuse_inference='auto', pad_stem='auto'):
    """Return a mixed-precision version of ``block`` that shares its parameters.

    Args:
        block (mxnet.gluon.HybridBlock): any hybridizable block, initialized or not, hybridized
            or not (e.g. a GluonCV model-zoo network).
        target_dtype (str): ``'bfloat16'`` (default; CPUs with oneDNN) or ``'float16'``
            (NVIDIA GPUs). Ignored when ``policy`` is given.
        cast_params (bool): store the weights of low-precision layers (Convolution,
            FullyConnected, ...) in the target dtype: the shared ``Parameter`` objects are cast
            (as ``block.cast()`` would), so the original block then sees them in that dtype too.
            Use :class:`mxmp.Trainer`, which keeps float32 master weights for them.
            BatchNorm's gamma, beta and running statistics always stay float32. Default False:
            weights stay float32 with one in-graph cast each.
        emulate (bool): run low-precision numerics with float32 kernels (for CPUs without
            bfloat16 kernels and for float16 on CPU); see :mod:`mxmp.graph`. Default False.
        policy (mxmp.Policy): op classes and overrides (``lp_ops``, ``fp32_ops``,
            ``excluded_names``); default ``Policy(target_dtype, emulate=emulate)``.
        data_names (tuple of str): names of the block's inputs, in call order; default
            ``('data',)``.
        data_dtypes (dict of str -> dtype): dtypes of the inputs (default float32).
        fuse_inference ('auto', True or False): inference calls (hybridized block, outside
            ``autograd.record()`` and ``autograd.train_mode()``, CPU) run a second graph made by
            MXNet's oneDNN fusion (``optimize_for('MKLDNN')``: Convolution + BatchNorm + ReLU
            (+ add) as one kernel), sharing the parameters; training always runs the unfused
            graph. ``'auto'`` (default): fused when the real low-precision kernels run (not
            emulated and :func:`mxmp.lp_kernels_available`, and ``MXNET_SUBGRAPH_BACKEND`` is
            not ``NONE`` when the call runs). ``True``: on every CPU, emulated
            too (emulation's rounding nodes stop the low-precision convolutions from folding
            BatchNorm; float32 parts fuse). ``False``: never. Fusion folds BatchNorm into the
            weights before bfloat16 rounding, so fused outputs differ from unfused ones (and
            from emulation) by bfloat16-sized amounts; only the unfused graph is bit-identical
            to emulation. If MXNet refuses to fuse a graph, or an output of the graph also feeds
            another node (MXNet's fusion can return a wrong value there), a warning is logged
            and the unfused graph runs. See :mod:`mxmp.fusion`.
        pad_stem ('auto', True or False): at the first call, feed a Convolution whose data is
            an input with an odd channel count (the 3-channel stem of an image network, NCHW)
            one zero channel more, its weight a zero column (``Concat`` in the graph: the same
            function, the ``Parameter`` keeps its shape, checkpoints and exports load as
            before). oneDNN then runs its blocked bfloat16 kernels on the stem and its
            BatchNorm (measured faster: docs/benchmark.md). ``'auto'`` (default): for
            bfloat16 where the real kernels run (not emulated); ``True``: always; ``False``:
            never. The fused inference graph (``fuse_inference``) is padded the same way. See
            :mod:`mxmp.graph.stem`.

    Returns:
        ConvertedBlock: call it with float32 NDArrays (shape as for ``block``); it returns
        float32 outputs. It trains under ``autograd.record()``, ``hybridize()``s and
        ``export()``s (``export`` strips the casts unless ``remove_amp_cast=False``).
        ``block`` may have run float32 forwards before (and after) the conversion: weights
        that oneDNN left in its blocked layout are brought back to the default layout before
        they are cast (:mod:`mxmp.layout`; MXNet's ``amp_cast`` fails on grouped and
        depthwise convolution weights in that layout).

    Raises:
        TypeError: ``block`` is not a HybridBlock or cannot be traced (the message names the fix).
        ValueError: unknown dtype; ``block`` is already a converted block; bad
            ``fuse_inference`` or ``pad_stem``.
    """
    if fuse_inference not in ('auto', True, False):
        raise ValueError("fuse_inference=%r: use 'auto' (fused where the real low-precision "
                         "kernels run), True (always on CPU) or False (never)" % (fuse_inference,))
    check_pad_stem(pad_stem)
    if getattr(block, 'mxmp_policy', None) is not None:
        raise ValueError(
            'this block was already converted by mxmp (target dtype %s); converting twice would '
            'stack casts. Convert the original instead: mxmp.convert(block.mxmp_source, ...)'
            % block.mxmp_policy.target_dtype)
    if not isinstance(block, gluon.HybridBlock):
        raise TypeError(
            'mxmp.convert needs a gluon.HybridBlock, got %s (a plain gluon.Block cannot be '
            'traced into a graph). Write it as a HybridBlock with hybrid_forward(self, F, x), or '
            'convert its HybridBlock children one by one.' % type(block).__name__)
    if isinstance(data_names, str):
        data_names = (data_names,)
    if policy is None:
        policy = Policy(normalize_dtype(target_dtype), emulate=emulate)
    elif emulate and not policy.emulate:
        policy = policy.replace(emulate=True)
    inputs, sym = _trace(block, data_names, data_dtypes)
    converted = convert_symbol(sym, policy=policy, data_dtypes=data_dtypes,
                               cast_params=cast_params, data_names=data_names)
    params = block.collect_params()
    lp_names = cast_param_names(converted)
    lp_dtype = mx_dtype(policy.target_dtype)
    for name, param in params.items():
        param._mxmp_target_dtype = policy.target_dtype  # read by mxmp.Trainer
        if name in lp_names:
            _cast_parameter(param, lp_dtype)
    grouped_cast = _grouped_weights_cast_in_graph(converted)
    with warnings.catch_warnings():
        # SymbolBlock warns that it cannot type the data inputs before the first call.
        warnings.simplefilter('ignore', UserWarning)
        out = ConvertedBlock(converted, inputs, params=params)
    out.mxmp_policy = policy
    out.mxmp_cast_params = bool(cast_params)
    out.mxmp_source = block
    out._mxmp_grouped_cast_weights = [p for n, p in params.items() if n in grouped_cast]
    out.mxmp_fuse_inference = fuse_inference
    out._mxmp_pad_stem = pad_stem
    precast = None
    if not cast_params and not policy.emulate:
        def precast(args):  # the fused graph takes target-dtype weights (see mxmp.fusion)
            graph = convert_symbol(sym, policy=policy, data_dtypes=data_dtypes, cast_params=True,
                                   data_names=data_names)
            if padded_convolutions(out._cached_graph[1]):  # pad_stem padded the block's graph
                graph = pad_stem_of(graph, {s.name: a.shape for s, a in
                                            zip(out._cached_graph[0], args)})
            return graph, cast_param_names(graph), lp_dtype
    out._mxmp_fused = FusedInference(out, precast)  # not a Block: no child, no parameter names
    logger.info('converted %s to %s%s: %d casts, %d parameters stored in %s', block.name,
                policy.target_dtype, ' (emulated)' if policy.emulate else '',
                count_casts(converted)['amp_cast'], len(lp_names), policy.target_dtype)
    return out


def _arrays_on(params, ctx):
    """The arrays of the initialized ``params`` on ``ctx`` (others: MXNet's own errors follow)."""
    out = []
    for param in params:
        if param._data is not None:
            try:
                out.append(param.data(ctx))
            except RuntimeError:
                pass
    return out


def _grouped_weights_cast_in_graph(sym):
    """Names of the variables that the converted graph casts (``amp_cast``/``amp_multicast``)
    and that feed, through that cast, the weight input of a grouped Convolution/Deconvolution.

    Only those break on oneDNN's blocked layout (one dimension more than the array, see
    :mod:`mxmp.layout`); bringing every cast weight back on every call would put a host sync per
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


def _cast_parameter(param, dtype):
    """``Parameter.cast`` with ``amp_cast``, which rounds to nearest even.

    ``NDArray.astype`` to bfloat16 does not round the same way as ``amp_cast`` (measured: the
    sums of a cast conv weight differ in the third digit), and on a weight that oneDNN has
    reordered it gives arrays whose size does not match their oneDNN descriptor.
    """
    from mxnet import autograd
    if param._data is None:
        # Not initialized yet. MXNet's initializers cannot fill bfloat16 arrays ("Output type
        # must be float16, float32, float64"), so initialize in the current dtype and cast
        # right after: this instance's _finish_deferred_init (which both initialize() and the
        # first forward call) is wrapped; nothing else is patched.
        initial, finish = param._dtype, param._finish_deferred_init

        def finish_then_cast():
            del param._finish_deferred_init
            param._dtype = initial
            finish()
            _cast_parameter(param, dtype)

        param._dtype = dtype
        param._finish_deferred_init = finish_then_cast
        return
    param._dtype = dtype
    with autograd.pause():
        to_default_layout(param._data)  # amp_cast fails on grouped weights oneDNN reordered
        param._data = [mx.nd.amp_cast(d, dtype=dtype) for d in param._data]
        if param._grad is None:
            return
        param._grad = [mx.nd.amp_cast(g, dtype=dtype) for g in param._grad]
        autograd.mark_variables(param._data, param._grad, param.grad_req)
