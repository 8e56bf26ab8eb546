"""The convert calls of :mod:`mxmp.amp` on mxmp's graph pass, with contrib.amp's meaning of the
op lists (:func:`policy_for`) and contrib.amp's list names (:func:`contrib_lists`), computed from
mxmp's op classes.

``mxnet.contrib.amp.convert_symbol`` (MXNet 1.9.1): each list given replaces its default, the
lists must be disjoint and hold only ops some list can take, and an op in no list runs in its
data's dtype with its parameters stored in that dtype (``Policy.follow_params``).
"""
import logging
import warnings

import numpy as np

from ..errors import AmpListConflict
from ..policy.tables import classes_for
from .contrib_amp import _dtype, _policy  # noqa: F401  (mxmp.amp re-exports _policy)

__all__ = ['convert_symbol', 'convert_model', 'convert_hybrid_block', 'policy_for',
           'check_lists', 'cast_to_graph', 'contrib_lists', 'module_names']

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
        data_names (list of str): the graph's data inputs; the others are parameters.
            Default, as in contrib.amp: every input without a ``__dtype__`` attribute.
        cast_optional_params (bool): ``cast_params=True`` (the caller casts the arrays, as
            :func:`convert_model` does).

    Returns:
        Symbol: the real (never emulated) mixed-precision graph, float32 outputs.

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
                    cast_params=True if cast_optional_params else None)


def _undeclared_inputs(sym):
    """The inputs of ``sym`` without a ``__dtype__`` attribute (contrib.amp's data inputs)."""
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
    return out, cast_to_graph(out, arg_params), cast_to_graph(out, aux_params)


def convert_hybrid_block(block, target_dtype=None, target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False):
    """Return a mixed-precision copy of a HybridBlock's graph that *shares* its Parameters.

    Same signature as ``mxnet.contrib.amp.convert_hybrid_block`` except the defaults of
    ``target_dtype`` (:func:`init`'s, else ``'float16'``) and ``ctx`` (None: where the
    parameters are). The result is a new ``gluon.SymbolBlock`` converted by
    :func:`mxmp.convert` (inputs: the block's cached graph's, else ``('data',)``; emulated
    where ``ctx`` has no kernels); ``block`` keeps computing in float32.
    ``cast_optional_params=True`` stores the shared low-precision weights in the target dtype.

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
    policy = _policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                     excluded_sym_names)
    return convert(copy, policy=policy, cast_params=True if cast_optional_params else None)


def policy_for(dtype, lp_ops, fp32_ops, conditional, excluded_names=(), emulate='auto',
               init_lp=(), init_fp32=(), init_conditional=()):
    """The Policy of a convert call, with contrib.amp's meaning of the op lists: a list given
    (not None) *replaces* its default (``lp_ops``, ``fp32_ops``: tuples of op names;
    ``conditional``: ``(op, attr, values)`` rules); None takes the default plus what
    :func:`mxmp.amp.init` recorded (``init_*``). A default op the given lists leave out follows
    its data, its parameters stored in the data's dtype (``follow_params``).

    Raises:
        AmpListConflict: see :func:`check_lists`.
    """
    from ..policy.policy import Policy
    classes = classes_for(dtype)
    base_lp, base_fp32 = set(classes['LOW_PRECISION']), set(classes['FLOAT32'])
    init_lp, init_fp32 = set(init_lp), set(init_fp32)
    lp = (base_lp - init_fp32) | init_lp if lp_ops is None else set(lp_ops)
    fp32 = (base_fp32 - init_lp) | init_fp32 if fp32_ops is None else set(fp32_ops)
    if conditional is None:
        rules = tuple((op, attr, tuple(values)) for op, attr, values
                      in contrib_lists(dtype)['conditional']) + tuple(init_conditional)
    else:
        rules = tuple(conditional)
    check_lists(dtype, lp, fp32, {op for op, _, _ in rules},
                (lp_ops is None, fp32_ops is None, conditional is None))
    follow = ((base_lp - lp) | (base_fp32 - fp32)) - lp - fp32
    return Policy(dtype, lp_ops=lp - base_lp, fp32_ops=fp32 - base_fp32 - classes['LOSS_OUTPUT'],
                  excluded_names=excluded_names, emulate=emulate, follow_ops=follow,
                  conditional_fp32=rules, follow_params=True)


def check_lists(dtype, lp, fp32, cond_ops, defaults):
    """contrib.amp's checks of the effective op sets ``lp``, ``fp32``, ``cond_ops`` of
    ``dtype``; ``defaults`` (3 bools) says which are the default lists, for the message.

    Raises:
        AmpListConflict: an op in two lists; a widest-type or unregistered op in a list.
    """
    named = {'target_dtype_ops': lp, 'fp32_ops': fp32, 'conditional_fp32_ops': cond_ops}
    default = dict(zip(named, defaults))
    for a, b in (('target_dtype_ops', 'fp32_ops'), ('target_dtype_ops', 'conditional_fp32_ops'),
                 ('fp32_ops', 'conditional_fp32_ops')):
        common = sorted(named[a] & named[b])
        if common:
            note = ''.join('; %s was not given, so it is the default list' % n
                           for n in (a, b) if default[n])
            raise AmpListConflict(
                'Ops cannot be in two or more lists: %s in both %s and %s%s. Put each op in '
                'one list.' % (', '.join(common), a, b, note))
    lists = contrib_lists(dtype)
    allowed = set(lists['lp16']) | set(lists['lp16_fp32']) | set(lists['fp32']) | {
        op for op, _, _ in lists['conditional']}
    for name, ops in named.items():
        illegal = sorted(ops - allowed)
        if illegal:
            widest = sorted(set(illegal) & set(lists['widest']))
            why = ('%s cast all their inputs to the widest dtype among them '
                   '(amp.list_widest_type_cast), which no list changes' % ', '.join(widest)
                   if widest else 'MXNet registers no op named %s' % ', '.join(illegal))
            raise AmpListConflict('%s cannot take %s: %s. Choose ops from amp.list_lp16_ops, '
                                  'amp.list_fp32_ops, amp.list_lp16_fp32_ops or '
                                  'amp.list_conditional_fp32_ops.'
                                  % (name, ', '.join(illegal), why))


def cast_to_graph(sym, params):
    """A new dict: each array cast to its variable's ``__dtype__`` in ``sym`` (if it has one).

    Args:
        sym (Symbol): a converted graph.
        params (dict of str -> NDArray): arrays named as the graph's variables.
    """
    import mxnet as mx
    from ..dtypes import from_mshadow_enum, mx_dtype
    from ..graph.symbol_json import FLOAT_DTYPES, load
    from ..device import to_default_layout
    wanted = {n['name']: from_mshadow_enum(n.get('attrs', {}).get('__dtype__'))
              for n in load(sym)['nodes'] if n['op'] == 'null'}
    out = {}
    for name, value in params.items():
        dtype = wanted.get(name)
        if dtype in FLOAT_DTYPES and np.dtype(value.dtype) != np.dtype(mx_dtype(dtype)):
            to_default_layout([value])   # amp_cast fails on weights oneDNN reordered in place
            value = mx.nd.amp_cast(value, dtype=mx_dtype(dtype))
        out[name] = value
    return out


def contrib_lists(target_dtype):
    """contrib.amp's lists of ``target_dtype`` from mxmp's op classes: a new dict of sorted
    lists ``'lp16'``, ``'lp16_fp32'``, ``'fp32'``, ``'widest'``, ``'loss'`` (op names) and
    ``'conditional'`` (``(op, attribute, sorted values)``). Raises ValueError for another
    dtype.
    """
    classes = classes_for(target_dtype)
    rules = classes['CONDITIONAL_FLOAT32']
    conditional = sorted((op, attr, sorted(values)) for op, attrs in rules.items()
                         for attr, values in attrs.items())
    cond_ops = set(rules)

    def listed(*names):
        return sorted(set().union(*(classes[n] for n in names)) - cond_ops)

    return {'lp16': listed('LOW_PRECISION'), 'lp16_fp32': listed('FOLLOW'),
            'fp32': listed('FLOAT32', 'LOSS_OUTPUT'), 'widest': listed('WIDEST_TYPE'),
            'conditional': conditional, 'loss': sorted(classes['LOSS_OUTPUT'])}


def module_names(target_dtype):
    """The module-level names of contrib.amp's ``lists/symbol_fp16.py`` (``target_dtype``
    float16) or ``symbol_bf16.py``: ``FP16_FUNCS``/``BF16_FUNCS`` (LOW_PRECISION),
    ``*_FP32_FUNCS`` (FOLLOW), ``FP32_FUNCS`` (FLOAT32, LOSS_OUTPUT), ``WIDEST_TYPE_CASTS``,
    ``CONDITIONAL_FP32_FUNCS``, ``LOSS_OUTPUT_FUNCTIONS``, from :func:`contrib_lists`.
    """
    lists = contrib_lists(target_dtype)
    prefix = {'float16': 'FP16', 'bfloat16': 'BF16'}[target_dtype]
    return {prefix + '_FUNCS': lists['lp16'], prefix + '_FP32_FUNCS': lists['lp16_fp32'],
            'FP32_FUNCS': lists['fp32'], 'WIDEST_TYPE_CASTS': lists['widest'],
            'CONDITIONAL_FP32_FUNCS': lists['conditional'], 'LOSS_OUTPUT_FUNCTIONS': lists['loss']}
