"""The convert calls of :mod:`mxmp.amp` (``mxnet.contrib.amp``'s ``convert_symbol``,
``convert_model``, ``convert_hybrid_block``) on mxmp's graph pass, with the defaults recorded by
:func:`mxmp.amp.init` (:mod:`mxmp.compat.contrib_amp`)."""
import logging

from ..compat import contrib_amp as _amp
from ..compat.contrib_amp import _conditional, _dtype, _names

__all__ = ['convert_symbol', 'convert_model', 'convert_hybrid_block']

logger = logging.getLogger('mxmp.amp')


def _policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops, excluded_sym_names,
            emulate=False):
    """The mxmp Policy of a convert call (:func:`mxmp.amp.convert_policy.policy_for`)."""
    from .convert_policy import policy_for
    if excluded_sym_names is not None and (isinstance(excluded_sym_names, str) or
                                           not isinstance(excluded_sym_names, (list, tuple,
                                                                               set))):
        raise ValueError('excluded_sym_names must be a list of node names, got %r'
                         % (excluded_sym_names,))
    return policy_for(
        _dtype(target_dtype),
        None if target_dtype_ops is None else _names(target_dtype_ops, 'target_dtype_ops'),
        None if fp32_ops is None else _names(fp32_ops, 'fp32_ops'),
        None if conditional_fp32_ops is None else _conditional(conditional_fp32_ops),
        excluded_names=set(excluded_sym_names or ()), emulate=emulate,
        init_lp=_amp._CONFIG.lp_ops, init_fp32=_amp._CONFIG.fp32_ops,
        init_conditional=_amp._CONFIG.conditional_fp32_ops)


def convert_symbol(sym, target_dtype=None, target_dtype_ops=None, fp32_ops=None,
                   conditional_fp32_ops=None, excluded_sym_names=None, data_names=None,
                   cast_optional_params=False):
    """Add cast nodes to a float32 Symbol (:func:`mxmp.convert_symbol`).

    Same signature as ``mxnet.contrib.amp.convert_symbol`` except that ``target_dtype``
    defaults to the dtype recorded by :func:`mxmp.amp.init` (else ``'float16'``).

    Args:
        sym (Symbol): the float32 graph.
        target_dtype (str): ``'float16'`` or ``'bfloat16'``.
        target_dtype_ops, fp32_ops (list of str): replace the default low-precision /
            float32 lists (None: the defaults, :func:`list_lp16_ops`, :func:`list_fp32_ops`,
            with :func:`init`'s additions); loss outputs stay float32. An op that ends up in
            no list runs in the dtype of its data, its parameters stored in that dtype.
        conditional_fp32_ops (list of (op, attr, values)): replace the default rules
            (:func:`list_conditional_fp32_ops`); matching nodes compute in float32, the
            others follow their data.
        excluded_sym_names (list of str): node names kept in float32.
        data_names (list of str): the graph's data inputs (never stored in low precision,
            typed float32); the others are parameters. Default (None), as in contrib.amp:
            every input without a ``__dtype__`` attribute, so in a graph built with ``mx.sym``
            alone every input is data and ``cast_optional_params`` stores nothing (give the
            names, or use :func:`convert_model`, which takes the inputs not in its parameter
            dicts). ``[]``: every input is a parameter.
        cast_optional_params (bool): give the parameters whose every consumer runs in the
            target dtype that dtype in the graph (``cast_params=True``); cast their arrays to
            match, as :func:`convert_model` does.

    Returns:
        Symbol: the mixed-precision graph with float32 outputs. It is the real graph, never
        the emulated one. Save it with ``sym.save(path, remove_amp_cast=False)`` to keep the
        casts (MXNet strips them by default).

    Raises:
        AmpListConflict: an op in two lists (the default lists included), or a widest-type
            or unregistered op in a list; a ValueError and an AssertionError.
        ValueError: unknown dtype; malformed lists; an already converted graph.
    """
    from ..graph import convert_symbol as _convert
    policy = _policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                     excluded_sym_names)
    if data_names is None:
        data_names = _undeclared_inputs(sym)
    return _convert(sym, policy=policy, data_names=tuple(data_names),
                    cast_params=bool(cast_optional_params))


def _undeclared_inputs(sym):
    """The inputs of ``sym`` without a ``__dtype__`` attribute: contrib.amp's data inputs
    when ``data_names`` is not given (``mxnet.contrib.amp.convert_symbol``, MXNet 1.9.1)."""
    from ..graph.symbol_json import load
    return [n['name'] for n in load(sym)['nodes']
            if n['op'] == 'null' and '__dtype__' not in n.get('attrs', {})]


def convert_model(sym, arg_params, aux_params, target_dtype=None, target_dtype_ops=None,
                  fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                  cast_optional_params=False):
    """Convert a float32 model (symbol and parameters) for mixed-precision inference.

    Same signature and return value as ``mxnet.contrib.amp.convert_model`` (``target_dtype``
    defaults to :func:`init`'s). The inputs that are not in ``arg_params``/``aux_params`` are
    the data inputs. Unlike contrib.amp the given dicts are not modified: new dicts are
    returned.

    Returns:
        tuple (Symbol, dict, dict): the converted graph, and the parameters, each cast to the
        dtype the graph gives its variable (``__dtype__``, as contrib.amp): the target dtype
        where ``cast_optional_params=True`` stores it so, float32 otherwise.

    Raises:
        TypeError: ``arg_params``/``aux_params`` are not dicts.
        ValueError: as :func:`convert_symbol`.
    """
    if not isinstance(arg_params, dict) or not isinstance(aux_params, dict):
        raise TypeError('arg_params and aux_params must be dicts of name -> NDArray')
    data_names = [n for n in sym.list_inputs() if n not in arg_params and n not in aux_params]
    out = convert_symbol(sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                         excluded_sym_names, data_names, cast_optional_params)
    from .convert_policy import cast_to_graph
    return out, cast_to_graph(out, arg_params), cast_to_graph(out, aux_params)


def convert_hybrid_block(block, target_dtype=None, target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False):
    """Return a mixed-precision version of a HybridBlock, for training or inference.

    Same signature as ``mxnet.contrib.amp.convert_hybrid_block`` except the defaults of
    ``target_dtype`` (:func:`init`'s dtype, else ``'float16'``) and ``ctx`` (None: where the
    parameters are; contrib.amp defaults to ``gpu(0)``). Built on :func:`mxmp.convert`:

    * the block need not be hybridized or run first; its input names are taken from its
      cached graph if it has one, else ``('data',)``;
    * the result *shares* the block's Parameters (no copy), and trains: use it in the
      training loop with :func:`init_trainer` / :func:`scale_loss`;
    * **emulation** is chosen here: if ``ctx`` has no kernels for the target dtype
      (``mxmp.lp_kernels_available(target_dtype, ctx)`` is False: bfloat16 on a CPU without
      oneDNN's AVX-512 bfloat16 kernels, float16 on any CPU) the block runs float32 kernels on
      values rounded through the target dtype, the same numerics (logged at INFO). The
      result's ``mxmp_policy.emulate`` tells which one you got.

    Args:
        block (gluon.HybridBlock): the float32 block, initialized or not.
        ctx (mx.Context): context to check the kernels on and to move the (shared) parameters
            to if given; default: the parameters' context (or cpu).
        cast_optional_params (bool): store low-precision weights in the target dtype
            (``mxmp.convert(cast_params=True)``): train with ``mxmp.Trainer`` then, which
            keeps float32 master weights.
        Others as :func:`convert_symbol`.

    Returns:
        mxmp.ConvertedBlock (a gluon.SymbolBlock): float32 outputs.

    Raises:
        TypeError: not a HybridBlock.
        ValueError: as :func:`convert_symbol`; a block already converted.
    """
    import mxnet as mx
    from mxnet import gluon
    from ..device import lp_kernels_available
    from ..gluon import convert
    if not isinstance(block, gluon.HybridBlock):
        raise TypeError('block must be a gluon.HybridBlock, got %s' % type(block).__name__)
    cached = getattr(block, '_cached_graph', None)
    data_names = tuple(s.name for s in cached[0]) if cached else ('data',)
    if ctx is not None:
        block.collect_params().reset_ctx(ctx)
    else:
        ctxs = [c for p in block.collect_params().values() if p._ctx_list
                for c in p._ctx_list]
        ctx = ctxs[0] if ctxs else mx.cpu()
    dtype = _dtype(target_dtype)
    emulate = not lp_kernels_available(dtype, ctx)
    if emulate:
        logger.info('mxmp.amp: %s has no %s kernels; the block emulates %s numerics with '
                    'float32 kernels', ctx, dtype, dtype)
    policy = _policy(dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                     excluded_sym_names, emulate=emulate)
    return convert(block, policy=policy, cast_params=bool(cast_optional_params),
                   emulate=emulate, data_names=data_names)

