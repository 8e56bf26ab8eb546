"""A Symbol's graph JSON: load and dump it, and the attributes mxmp writes on its nodes.

The graph pass works on the JSON of ``Symbol.tojson(remove_amp_cast=False)`` (MXNet 1.9.1: the
default, ``remove_amp_cast=True``, drops every cast node). This module holds what every part of
mxmp that reads or writes that JSON shares: the attribute keys that mark what mxmp wrote
(:data:`MARK`, :data:`ROUND_MARK`, :data:`PINNED`), the one test of whether a variable is a
``cast_params`` parameter (:func:`is_cast_param`, :func:`cast_param_names`), who wrote a cast
(:func:`cast_origin`) and the ``__dtype__`` attributes of variables (:func:`pin_variable_dtypes`;
the value is mshadow's dtype enum, ``include/mshadow/base.h``: float16=2, bfloat16=12, see
:mod:`mxmp._src.dtypes`). ``amp_cast``/``amp_multicast`` are MXNet 1.9.1's cast operators
(``src/operator/tensor/amp_cast.cc``).
"""
import json

from ..dtypes import MSHADOW_ENUM

__all__ = ['MARK', 'ROUND_MARK', 'PINNED', 'CAST_OPS', 'FLOAT_DTYPES', 'load', 'dump',
           'is_cast_param', 'cast_param_names', 'cast_param_mark', 'cast_param_original',
           'is_float32_param', 'float32_param_names', 'float32_param_mark',
           'cast_origin', 'pin_variable_dtypes']

#: Attribute key that marks the nodes and variables mxmp wrote.
MARK = '__mxmp__'
#: Attribute key of the arithmetic rounding nodes of bfloat16 emulation: the target dtype.
ROUND_MARK = '__mxmp_round__'
#: MARK value of a variable whose ``__dtype__`` :func:`pin_variable_dtypes` wrote.
PINNED = 'pinned'
#: MARK value (a prefix) of a variable stored in the target dtype by ``cast_params=True``.
_CAST_PARAM = 'cast_param'
#: MARK value (a prefix) of a variable declared in low precision (``__dtype__``) that the pass
#: stores in float32, because an input MXNet needs as a graph variable takes it in float32
#: (:mod:`mxmp._src.graph.plan`, "storage rules").
_FLOAT32_PARAM = 'float32_param'
#: Attribute key of the nodes :func:`mxmp._src.graph.stem.pad_stem` adds (value: the padded
#: convolution's name), and of a weight variable whose ``__shape__`` it wrote (value
#: ``'shape:'`` + the ``__shape__`` it had before, empty if none).
STEM_MARK = '__mxmp_stem__'
#: STEM_MARK value prefix of a variable whose ``__shape__`` :func:`mxmp._src.graph.stem.pad_stem`
#: wrote.
STEM_SHAPE = 'shape:'
#: MXNet's mixed-precision cast operators.
CAST_OPS = ('amp_cast', 'amp_multicast')
#: The float dtypes a variable can be pinned to.
FLOAT_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')


def load(sym):
    """The graph JSON (dict) of a Symbol, cast nodes included.

    Raises:
        TypeError: ``sym`` is not an ``mxnet.symbol.Symbol`` (the message names
            ``mxmp.convert`` for Gluon blocks).
    """
    import mxnet as mx
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError('expected an mxnet.symbol.Symbol, got %s; for a Gluon block use '
                        'mxmp.convert(block)' % type(sym).__name__)
    return json.loads(sym.tojson(remove_amp_cast=False))


def dump(js):
    """The Symbol of a graph JSON (dict); ``arg_nodes`` is recomputed from the nodes."""
    import mxnet as mx
    js = dict(js)
    js['arg_nodes'] = [i for i, n in enumerate(js['nodes']) if n['op'] == 'null']
    js.pop('node_row_ptr', None)
    return mx.sym.load_json(json.dumps(js))


def is_cast_param(node):
    """bool: whether a node of the graph JSON is a variable that ``convert_symbol(...,
    cast_params=True)`` stores in the target dtype (mxmp's :data:`MARK` says so)."""
    return node['op'] == 'null' and node.get('attrs', {}).get(MARK, '').startswith(_CAST_PARAM)


def cast_param_names(sym):
    """frozenset of str: the variables of ``sym`` (an mxnet Symbol, or its graph JSON dict) that
    ``convert_symbol(..., cast_params=True)`` stores in the target dtype: their arrays must be
    cast to it."""
    js = sym if isinstance(sym, dict) else load(sym)
    return frozenset(n['name'] for n in js['nodes'] if is_cast_param(n))


def float32_param_names(sym):
    """frozenset of str: the variables of ``sym`` (an mxnet Symbol, or its graph JSON dict)
    declared in low precision that the converted graph stores in float32 instead: their
    arrays (e.g. the Parameters of a block after ``net.cast('bfloat16')``) must be cast to
    float32."""
    js = sym if isinstance(sym, dict) else load(sym)
    return frozenset(n['name'] for n in js['nodes'] if is_float32_param(n))


def is_float32_param(node):
    """bool: whether a node of the graph JSON is a low-precision variable the pass stores in
    float32 (mxmp's :data:`MARK` says so)."""
    return node['op'] == 'null' and \
        node.get('attrs', {}).get(MARK, '').startswith(_FLOAT32_PARAM + ':')


def float32_param_mark(attrs):
    """The :data:`MARK` value of a variable the pass stores in float32 though its
    ``__dtype__`` (in ``attrs``) is a low-precision dtype; :func:`cast_param_original` gives
    that ``__dtype__`` back."""
    return '%s:%s' % (_FLOAT32_PARAM, attrs.get('__dtype__', ''))


def cast_param_mark(attrs):
    """The :data:`MARK` value of a ``cast_params`` variable: it keeps the variable's own
    ``__dtype__`` (if any, from ``attrs``), which :func:`cast_param_original` gives back."""
    return '%s:%s' % (_CAST_PARAM, attrs.get('__dtype__', ''))


def cast_param_original(attrs):
    """The ``__dtype__`` a variable whose storage mxmp chose (``cast_params``, or float32
    for a low-precision variable) had before mxmp set it ('' for none)."""
    return attrs[MARK].partition(':')[2]


def cast_origin(node):
    """Who wrote a cast node of the graph JSON: ``'mxmp'``, ``'contrib.amp'``, ``'model'``, or
    None for a node that is not a cast.

    The rule (MXNet 1.9.1 facts, measured by converting a graph with
    ``mxnet.contrib.amp.convert_symbol`` and reading its JSON):

    * ``'mxmp'``: an ``amp_cast``/``amp_multicast`` carrying mxmp's :data:`MARK` attribute, or
      one of mxmp's bfloat16 rounding nodes (:data:`ROUND_MARK`).
    * ``'contrib.amp'``: contrib.amp's pass (``src/nnvm/low_precision_pass.cc``) marks nothing,
      but names its casts by a fixed pattern: an ``amp_cast`` named ``<tensor>_amp_cast_<dtype>``
      with ``<dtype>`` its own ``dtype`` attribute (``fc_output_amp_cast_float32``,
      ``data_amp_cast_bfloat16``), and an ``amp_multicast`` named ``<node>_<k>_amp_multicast``.
    * ``'model'``: every other cast: ``Cast``/``cast`` (neither mxmp nor contrib.amp writes
      one), and ``amp_cast``/``amp_multicast`` nodes that model code wrote: Gluon names them
      ``<prefix>amp_cast0``/``<prefix>amp_multicast0`` (GluonCV's box decoders), the Symbol
      API ``amp_cast0`` or the name the author chose. A model cast named like contrib.amp's
      would be taken for one of contrib.amp's.

    Mixed-precision casts (mxmp's and contrib.amp's) only mark precision boundaries: the pass
    removes them and plans again. Model casts are part of what the model computes and stay.
    """
    op, attrs = node['op'], node.get('attrs', {})
    if ROUND_MARK in attrs:
        return 'mxmp'
    if op in ('Cast', 'cast'):
        return 'model'
    if op not in CAST_OPS:
        return None
    if attrs.get(MARK) is not None:
        return 'mxmp'
    name = node['name']
    if op == 'amp_cast' and attrs.get('dtype') and name.endswith('_amp_cast_' + attrs['dtype']):
        return 'contrib.amp'
    if op == 'amp_multicast' and name.endswith('_amp_multicast'):
        return 'contrib.amp'
    return 'model'


def pin_variable_dtypes(nodes, dtypes):
    """Write each variable's dtype into the graph (``__dtype__``), in place on JSON nodes.

    Behind an ``amp_cast`` MXNet cannot infer a variable's dtype (a cast accepts any input
    dtype), so a converted graph bound by plain MXNet (``mx.mod.Module(sym).bind``, which types
    only the data and labels) fails with "InferType pass cannot decide dtypes ...
    fc_weight: -1". ``mxnet.contrib.amp`` writes ``__dtype__`` for the same reason. Variables
    that already have a ``__dtype__`` keep it; the pinned ones are marked so that
    :func:`mxmp.remove_casts` gives the float32 graph back exactly.

    Args:
        nodes (list of dict): the graph JSON's ``nodes`` (modified in place).
        dtypes (dict of str -> str): variable name -> dtype name (``'float32'``, ...); names
            not given, and non-float dtypes, are left alone.
    """
    for node in nodes:
        dtype = dtypes.get(node['name'])
        if node['op'] != 'null' or dtype not in FLOAT_DTYPES or \
                '__dtype__' in node.get('attrs', {}):
            continue
        node['attrs'] = dict(node.get('attrs', {}), __dtype__=MSHADOW_ENUM[dtype])
        node['attrs'][MARK] = PINNED
