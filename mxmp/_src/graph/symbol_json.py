"""A Symbol's graph JSON (``tojson(remove_amp_cast=False)``): load, dump, MXNet's dtype
inference on it by node position, the attributes mxmp writes on its nodes, and MXNet's graph
loaders wrapped so that a graph holding mxmp's library ops loads the library first.

The ``__mxmp*`` strings below are attribute keys of graph nodes, not side channels.
"""
import functools
import json
import re

import numpy as np

from ..dtypes import LOW_PRECISION_DTYPES, MSHADOW_ENUM, dtype_name

__all__ = ['MARK', 'NAME_MARK', 'ROUND_MARK', 'PINNED', 'RESIDUAL_MARK', 'TRUE_STRINGS', 'CAST_OPS',
           'FLOAT_DTYPES', 'load', 'dump',
           'is_cast_param', 'cast_param_names', 'storage_mark', 'original_dtype',
           'cast_origin', 'pin_variable_dtypes', 'infer_dtypes', 'node_output_dtypes',
           'mutable_inputs', 'unique_name', 'install_symbol_loaders']

#: Attribute key that marks the nodes and variables mxmp wrote.
MARK = '__mxmp__'   # a graph attribute key, not a side channel
#: Attribute key of an op node renamed so that a cast after it takes its name as a graph output
#: (:mod:`mxmp._src.graph.output_names`): the node's own name, given back by ``strip``.
NAME_MARK = '__mxmp_name__'   # a graph attribute key
#: Attribute key of the arithmetic rounding nodes of bfloat16 emulation: the target dtype.
ROUND_MARK = '__mxmp_round__'   # a graph attribute key
#: MARK value of a variable whose ``__dtype__`` :func:`pin_variable_dtypes` wrote.
PINNED = 'pinned'
#: MARK value of the residual rule's identities (:mod:`.residual_rule`; :func:`mxmp.remove_casts`
#: drops them).
RESIDUAL_MARK = 'residual'
#: MARK value (a prefix) of a variable stored in the target dtype by ``cast_params=True``.
_CAST_PARAM = 'cast_param'
#: MARK value (a prefix) of a low-precision variable the pass stores in float32.
_FLOAT32_PARAM = 'float32_param'
#: Attribute key of the nodes ``pad_stem`` adds (value: the padded convolution's name), and of
#: a weight whose ``__shape__`` it wrote (value :data:`STEM_SHAPE` + its former ``__shape__``).
STEM_MARK = '__mxmp_stem__'   # a graph attribute key
STEM_SHAPE = 'shape:'
#: The strings MXNet's attribute parser reads as a true boolean.
TRUE_STRINGS = ('1', 'true', 'True')
#: MXNet's mixed-precision cast operators.
CAST_OPS = ('amp_cast', 'amp_multicast')
#: The float dtypes a variable can be pinned to.
FLOAT_DTYPES = ('float16', 'bfloat16', 'float32', 'float64')


def load(sym):
    """The graph JSON (dict) of a Symbol, cast nodes included, without control dependencies of
    variables (only :mod:`.grad_order` writes those: an order of MXNet's walk, no data).

    Raises:
        TypeError: ``sym`` is not an ``mxnet.symbol.Symbol`` (the message names
            ``mxmp.convert`` for Gluon blocks).
    """
    import mxnet as mx
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError('expected an mxnet.symbol.Symbol, got %s; for a Gluon block use '
                        'mxmp.convert(block)' % type(sym).__name__)
    js = json.loads(sym.tojson(remove_amp_cast=False))
    for node in js['nodes']:   # the gradient-order rule's walk order (graph/grad_order.py)
        if node['op'] == 'null':
            node.pop('control_deps', None)
    return js


def dump(js):
    """The Symbol of a graph JSON (dict); ``arg_nodes`` is recomputed from the nodes."""
    import mxnet as mx
    js = dict(js)
    js['arg_nodes'] = [i for i, n in enumerate(js['nodes']) if n['op'] == 'null']
    js.pop('node_row_ptr', None)
    return mx.sym.load_json(json.dumps(js))


def is_cast_param(node):
    """bool: whether a JSON node is a variable the pass stores in the target dtype."""
    return node['op'] == 'null' and node.get('attrs', {}).get(MARK, '').startswith(_CAST_PARAM)


def cast_param_names(sym):
    """frozenset of the variables of ``sym`` (a Symbol or its JSON dict) stored in the target
    dtype: their arrays must be cast to it."""
    return frozenset(n['name'] for n in (sym if isinstance(sym, dict) else load(sym))['nodes']
                     if is_cast_param(n))


def storage_mark(stored_dtype, attrs):
    """The :data:`MARK` value of a variable the pass stores in ``stored_dtype``; it keeps the
    variable's own ``__dtype__`` (from ``attrs``) for :func:`original_dtype`."""
    kind = _FLOAT32_PARAM if stored_dtype == 'float32' else _CAST_PARAM
    return '%s:%s' % (kind, attrs.get('__dtype__', ''))


def original_dtype(node):
    """The ``__dtype__`` a variable had before the pass wrote its dtype ('' for none), or None
    where the pass wrote none."""
    kind, _, original = node.get('attrs', {}).get(MARK, '').partition(':')
    return original if node['op'] == 'null' and kind in (PINNED, _CAST_PARAM, _FLOAT32_PARAM) \
        else None


def unique_name(name, taken):
    """``name``, else ``name`` and the first number that is not in ``taken`` (a set of names,
    which the result joins)."""
    base, k = name, 1
    while name in taken:
        name, k = '%s%d' % (base, k), k + 1
    taken.add(name)
    return name


def cast_origin(node):
    """Who wrote a cast node of the graph JSON: ``'mxmp'`` (marked by :data:`MARK` or
    :data:`ROUND_MARK`), ``'contrib.amp'`` (its pass names an ``amp_cast``
    ``<tensor>_amp_cast_<dtype>`` and an ``amp_multicast`` ``<node>_<k>_amp_multicast``),
    ``'model'`` (every other cast, ``Cast`` included), or None for a node that is not a cast
    (the kernel rule's nodes included: its ``Cast`` of softmax lengths only gives pick an index).
    The rule is documented in docs/pass.md."""
    op, attrs = node['op'], node.get('attrs', {})
    if ROUND_MARK in attrs:
        return 'mxmp'
    if str(attrs.get(MARK, '')).startswith('kernel_'):
        return None   # the kernel rule's nodes (its Cast of softmax lengths, an index dtype)
    if op in ('Cast', 'cast'):
        return 'model'
    if op == '_copy' and attrs.get(MARK) in ('accumulate', 'residual'):
        return 'mxmp'   # accumulate's and residual_rule's identities: removed with the casts
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
    """Write ``dtypes`` (``{variable name: float dtype name}``) into the variables of the JSON
    ``nodes`` as ``__dtype__``, in place, so plain MXNet binds a graph whose variables sit
    behind casts. Variables with a ``__dtype__`` keep it; the others are marked :data:`PINNED`
    (``remove_casts`` takes the attribute off again)."""
    for node in nodes:
        dtype = dtypes.get(node['name'])
        if node['op'] != 'null' or dtype not in FLOAT_DTYPES or \
                '__dtype__' in node.get('attrs', {}):
            continue
        node['attrs'] = dict(node.get('attrs', {}), __dtype__=MSHADOW_ENUM[dtype])
        node['attrs'][MARK] = PINNED


def infer_dtypes(js, input_dtypes):
    """``{(node id, output): dtype name}`` of every output a head reaches, from MXNet's
    ``infer_type_partial`` on the graph JSON ``js``; ids are positions in ``js['nodes']``.

    ``input_dtypes``: ``{input name: dtype}``; other inputs without ``__dtype__`` are float32.

    Raises:
        ValueError: MXNet cannot type the graph (its message, with node names).
    """
    # Low-precision inputs are typed by a ``__dtype__`` attribute on a copy (MXNet 1.9.1's
    # infer_type_partial drops bfloat16 keyword arguments); nodes are renamed to their ids.
    nodes, args = [], {}
    for nid, node in enumerate(js['nodes']):
        attrs = node.get('attrs', {})
        d = input_dtypes.get(node['name'])
        if node['op'] == 'null':
            if d in LOW_PRECISION_DTYPES and '__dtype__' not in attrs:
                attrs = dict(attrs, __dtype__=MSHADOW_ENUM[d])
            if '__dtype__' not in attrs:
                args[str(nid)] = np.dtype(d or 'float32')
        nodes.append(dict(node, name=str(nid), attrs=attrs))
    internals = dump(dict(js, nodes=nodes)).get_internals()
    try:
        _, out_types, _ = internals.infer_type_partial(**args)
    except Exception as err:  # MXNetError: inconsistent dtypes
        names = [n['name'] for n in js['nodes']]   # MXNet's message names the renamed ids
        message = re.sub(r'(operator |node )(\d+)\b', lambda m: m.group(1) + (
            names[int(m.group(2))] if int(m.group(2)) < len(names) else m.group(2)), str(err))
        raise ValueError('MXNet cannot infer the dtypes of the graph: %s' % message) from err
    result, previous, k = {}, None, 0
    for p, dtype in enumerate(out_types):
        owner = int(internals[p].name)
        k = k + 1 if owner == previous else 0
        previous = owner
        result[(owner, k)] = dtype_name(dtype)
    return result


def _one_node_graph(node, in_dtypes, n_out=1):
    """``node`` alone on variables ``i0``, ``i1``... typed by ``in_dtypes`` (None: untyped)."""
    n_in = len(in_dtypes)
    nodes = [{'op': 'null', 'name': 'i%d' % i, 'inputs': [],
              'attrs': {'__dtype__': MSHADOW_ENUM[d]} if d else {}}
             for i, d in enumerate(in_dtypes)]
    nodes.append(dict(node, inputs=[[i, 0, 0] for i in range(n_in)]))
    return {'nodes': nodes, 'heads': [[n_in, k, 0] for k in range(n_out)],
            'attrs': {'mxnet_version': ['int', 10901]}}


def node_output_dtypes(node, in_dtypes, n_out):
    """Output dtypes MXNet gives one node for the given input dtypes (a one-node graph)."""
    types = infer_dtypes(_one_node_graph(node, in_dtypes, n_out), {})
    return [types.get((len(in_dtypes), k)) for k in range(n_out)]


def mutable_inputs(node):
    """Positions of ``node``'s inputs that MXNet writes in place (auxiliary states: BatchNorm's
    moving statistics), which must be graph variables; from a one-node graph."""
    return _mutable_inputs(node['op'], json.dumps(node.get('attrs', {}), sort_keys=True),
                           len(node['inputs']))


@functools.lru_cache(maxsize=None)
def _mutable_inputs(op, attrs, n_in):
    node = {'op': op, 'name': 'node', 'attrs': json.loads(attrs)}
    aux = set(dump(_one_node_graph(node, [None] * n_in)).list_auxiliary_states())
    return tuple(i for i in range(n_in) if 'i%d' % i in aux)


_LOADERS = {}   # name -> MXNet's own graph loader (install_symbol_loaders)


def _symbol_loader(name, original):
    def load(source, *args, **kwargs):
        if name == 'load' or 'mxmp_' in str(source):   # a file, or a graph naming mxmp ops
            from ..kernels.loading import before_loading   # lazily: import budget
            before_loading(source, name == 'load')
        return original(source, *args, **kwargs)
    load.__doc__, load.__name__ = original.__doc__, original.__name__
    return load


def install_symbol_loaders():
    """Wrap MXNet's graph loaders ``mx.sym.load`` and ``mx.sym.load_json`` (which
    ``gluon.SymbolBlock.imports`` and ``mx.model.load_checkpoint`` call) so that a graph holding
    library ops loads the library first (:mod:`mxmp._src.kernels.loading`); run by ``import
    mxmp``, idempotent, kept by :func:`mxmp.remove_hooks`: graphs of MXNet's ops load as
    before. Besides :mod:`mxmp._src.gluon`'s hooks, the one place mxmp wraps MXNet's code.

    Why lazily, at load time: ``import mxmp`` stays fast and never compiles; graphs without
    library ops (every file mxmp writes unless the user asks for them) never build or load the
    library; a graph with them gets it, built once per machine, before MXNet meets its ops.
    """
    import mxnet as mx
    if _LOADERS:
        return
    for name in ('load', 'load_json'):
        _LOADERS[name] = getattr(mx.symbol, name)
        setattr(mx.symbol, name, _symbol_loader(name, _LOADERS[name]))
