"""The convert calls of :mod:`mxmp.amp` (``mxnet.contrib.amp``'s ``convert_symbol``,
``convert_model``, ``convert_hybrid_block``) on mxmp's graph pass, with the defaults recorded by
:func:`mxmp.amp.init` (:mod:`mxmp._src.amp.contrib_amp`)."""
import logging
import warnings

from .contrib_amp import _dtype, _policy  # noqa: F401  (mxmp.amp re-exports _policy)

__all__ = ['convert_symbol', 'convert_model', 'convert_hybrid_block']

logger = logging.getLogger('mxmp.amp')


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
    from ..graph.convert import convert_symbol as _convert
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
    """Return a mixed-precision copy of a HybridBlock's graph that shares its Parameters.

    Same signature as ``mxnet.contrib.amp.convert_hybrid_block`` except the defaults of
    ``target_dtype`` (:func:`init`'s dtype, else ``'float16'``) and ``ctx`` (None: where the
    parameters are; contrib.amp defaults to ``gpu(0)``). As in contrib.amp the result is a new
    ``gluon.SymbolBlock`` and ``block`` keeps computing in float32; unlike it, the result
    *shares* the block's Parameters (no copy) and trains. To make the network itself compute
    in mixed precision (its methods, training outputs and every graph it builds), use
    :func:`init` or :func:`mxmp.convert` instead.

    * the block need not be hybridized or run first; its input names are those of its cached
      graph if it has one, else ``('data',)``;
    * where ``ctx`` has no kernels for the target dtype (``mxmp.lp_kernels_available``) the
      result emulates its numerics with float32 kernels (warned once).

    Args:
        block (gluon.HybridBlock): the float32 block (a SymbolBlock too), initialized or not.
        ctx (mx.Context): context to move the (shared) parameters to, if given.
        cast_optional_params (bool): store low-precision weights in the target dtype now
            (shared: ``block`` sees them in that dtype too); train with ``mxmp.Trainer``, which
            keeps float32 master weights.
        Others as :func:`convert_symbol`.

    Returns:
        gluon.SymbolBlock: converted as by :func:`mxmp.convert`; float32 outputs.

    Raises:
        TypeError: not a HybridBlock, or a block that cannot be traced.
        ValueError: as :func:`convert_symbol`.
    """
    import mxnet as mx
    from mxnet import gluon
    from ..gluon import convert
    if not isinstance(block, gluon.HybridBlock):
        raise TypeError('block must be a gluon.HybridBlock, got %s' % type(block).__name__)
    if ctx is not None:
        block.collect_params().reset_ctx(ctx)
    cached = getattr(block, '_cached_graph', None)
    if isinstance(block, gluon.SymbolBlock):
        inputs, sym = cached
    else:
        inputs = list(cached[0]) if cached else [mx.sym.var('data')]
        try:
            sym = block(*inputs)
        except Exception as err:  # any failure of hybrid_forward on Symbols
            raise TypeError('could not trace %s into a Symbol (%s: %s): its hybrid_forward '
                            'must use only F.* operators' % (block.name, type(err).__name__,
                                                             err)) from err
        if isinstance(sym, (list, tuple)):
            sym = mx.sym.Group(list(sym))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)   # SymbolBlock cannot type its inputs yet
        copy = gluon.SymbolBlock(sym, list(inputs), params=block.collect_params())
    policy = _policy(_dtype(target_dtype), target_dtype_ops, fp32_ops, conditional_fp32_ops,
                     excluded_sym_names)
    return convert(copy, policy=policy, cast_params=bool(cast_optional_params))
