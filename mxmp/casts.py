"""Cast nodes in an MXNet Symbol: read and write the graph JSON, find, count and remove casts.

The small, pass-independent half of :mod:`mxmp.graph`: the attribute keys that mark what mxmp
wrote (:data:`MARK`, :data:`ROUND_MARK`), :func:`remove_casts` (the float32 graph back),
:func:`converted_dtype` (the target dtype a graph was converted to), :func:`count_casts`, and
:func:`cast_origin` (who wrote a cast: mxmp, ``mxnet.contrib.amp`` or the model's own code).
``amp_cast``/``amp_multicast`` are MXNet 1.9.1's cast operators
(``src/operator/tensor/amp_cast.cc``); mshadow's dtype enum (``include/mshadow/base.h``:
float16=2, bfloat16=12) is what a variable's ``__dtype__`` attribute holds.
"""
import json

import numpy as np

__all__ = ['MARK', 'ROUND_MARK', 'remove_casts', 'converted_dtype', 'count_casts', 'cast_origin',
           'cast_origins']

#: Attribute key that marks the nodes and variables mxmp wrote.
MARK = '__mxmp__'
#: Attribute key of the arithmetic rounding nodes of bfloat16 emulation: the target dtype.
ROUND_MARK = '__mxmp_round__'
_CAST_OPS = ('amp_cast', 'amp_multicast')
_LOW = ('float16', 'bfloat16')
_MSHADOW_ENUM = {'float16': '2', 'bfloat16': '12'}
#: mshadow's enum of every float dtype a variable can be pinned to (include/mshadow/base.h).
_FLOAT_ENUM = {'float32': '0', 'float64': '1', 'float16': '2', 'bfloat16': '12'}
#: MARK value of a variable whose ``__dtype__`` :func:`pin_variable_dtypes` wrote.
PINNED = 'pinned'

def _dtype_name(t):
    """numpy dtype / type / None -> 'float32', 'bfloat16', ..., or None."""
    if t is None:
        return None
    d = np.dtype(t)
    return 'bfloat16' if d.names == ('bfloat16',) else d.name



# ---------------------------------------------------------------------------------------------
# Graph I/O
# ---------------------------------------------------------------------------------------------
def _load(sym):
    import mxnet as mx
    if not isinstance(sym, mx.sym.Symbol):
        raise TypeError('expected an mxnet.symbol.Symbol, got %s; for a Gluon block use '
                        'mxmp.convert(block)' % type(sym).__name__)
    return json.loads(sym.tojson(remove_amp_cast=False))


def _dump(js):
    import mxnet as mx
    js = dict(js)
    js['arg_nodes'] = [i for i, n in enumerate(js['nodes']) if n['op'] == 'null']
    js.pop('node_row_ptr', None)
    return mx.sym.load_json(json.dumps(js))


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
    if op not in _CAST_OPS:
        return None
    if attrs.get(MARK) is not None:
        return 'mxmp'
    name = node['name']
    if op == 'amp_cast' and attrs.get('dtype') and name.endswith('_amp_cast_' + attrs['dtype']):
        return 'contrib.amp'
    if op == 'amp_multicast' and name.endswith('_amp_multicast'):
        return 'contrib.amp'
    return 'model'


def _strip(js, unpin=False):
    """Remove the mixed-precision casts (mxmp's and contrib.amp's, see :func:`cast_origin`),
    mxmp's bfloat16 rounding nodes and mxmp's parameter dtypes (pure, on JSON). Model casts
    stay. ``unpin``: in a graph that holds contrib.amp casts, variables that contrib.amp
    stored in a low-precision dtype (``cast_optional_params=True``) become float32 too."""
    nodes = js['nodes']
    contrib = unpin and any(cast_origin(n) == 'contrib.amp' for n in nodes)
    resolve = {}  # (old nid, out idx) -> (old nid, out idx) of a kept node
    keep = []
    for nid, node in enumerate(nodes):
        if cast_origin(node) in ('mxmp', 'contrib.amp'):
            # A rounding node stands for its first input (the chain leads back to the tensor).
            for k, (src, idx, _) in enumerate(node['inputs']):
                if node['op'] == 'amp_multicast' or k == 0:
                    resolve[(nid, k)] = resolve.get((src, idx), (src, idx))
        else:
            keep.append(nid)
    new_id = {old: new for new, old in enumerate(keep)}

    def remap(entry):
        src, idx = resolve.get((entry[0], entry[1]), (entry[0], entry[1]))
        return [new_id[src], idx, entry[2]]

    out_nodes = []
    for old in keep:
        node = dict(nodes[old])
        node['inputs'] = [remap(e) for e in node['inputs']]
        attrs = node.get('attrs')
        if node['op'] == 'null' and attrs and attrs.get(MARK) == PINNED:
            attrs = {k: v for k, v in attrs.items() if k not in (MARK, '__dtype__')}
            if attrs:
                node['attrs'] = attrs
            else:
                node.pop('attrs')
        elif node['op'] == 'null' and attrs and attrs.get(MARK, '').startswith('cast_param'):
            original = attrs[MARK][len('cast_param:'):]
            attrs = {k: v for k, v in attrs.items() if k not in (MARK, '__dtype__')}
            if original:
                attrs['__dtype__'] = original
            if attrs:
                node['attrs'] = attrs
            else:
                node.pop('attrs')
        elif contrib and node['op'] == 'null' and attrs and \
                attrs.get('__dtype__') in _MSHADOW_ENUM.values():
            node['attrs'] = dict(attrs, __dtype__='0')   # float32, as contrib.amp writes it
        out_nodes.append(node)
    out = dict(js)
    out['nodes'] = out_nodes
    out['heads'] = [remap(h) for h in js['heads']]
    return out


def pin_variable_dtypes(nodes, dtypes):
    """Write each variable's dtype into the graph (``__dtype__``), in place on JSON nodes.

    Behind an ``amp_cast`` MXNet cannot infer a variable's dtype (a cast accepts any input
    dtype), so a converted graph bound by plain MXNet (``mx.mod.Module(sym).bind``, which types
    only the data and labels) fails with "InferType pass cannot decide dtypes ...
    fc_weight: -1". ``mxnet.contrib.amp`` writes ``__dtype__`` for the same reason. Variables
    that already have a ``__dtype__`` keep it; the pinned ones are marked so that
    :func:`remove_casts` gives the float32 graph back exactly.

    Args:
        nodes (list of dict): the graph JSON's ``nodes`` (modified in place).
        dtypes (dict of str -> str): variable name -> dtype name (``'float32'``, ...); names
            not given, and non-float dtypes, are left alone.
    """
    for node in nodes:
        dtype = dtypes.get(node['name'])
        if node['op'] != 'null' or dtype not in _FLOAT_ENUM or \
                '__dtype__' in node.get('attrs', {}):
            continue
        node['attrs'] = dict(node.get('attrs', {}), __dtype__=_FLOAT_ENUM[dtype])
        node['attrs'][MARK] = PINNED


def remove_casts(sym):
    """Return the float32 graph: ``sym`` without its mixed-precision casts.

    Removes the ``amp_cast``/``amp_multicast`` nodes that mxmp or ``mxnet.contrib.amp`` wrote
    (:func:`cast_origin` tells them apart) and mxmp's bfloat16 rounding nodes; consumers of a
    removed cast are rewired to the cast's input; variables whose dtype mxmp set
    (``cast_params=True``) lose that dtype, and so do those that contrib.amp stored in a
    low-precision dtype (``cast_optional_params=True``; their arrays must then be cast to
    float32, as ``mxmp convert --strip`` does). Casts that the model's own code wrote (``Cast``
    to an index dtype, GluonCV's ``amp_multicast`` in a box decoder) stay: they are part of
    what the model computes. ``remove_casts(convert_symbol(g))`` gives back ``g`` exactly
    (same nodes, names, attrs). (MXNet's ``Symbol.tojson(remove_amp_cast=True)`` instead drops
    every ``amp_cast``/``amp_multicast``, the model's too.)

    Args:
        sym (mxnet.symbol.Symbol): any graph.

    Returns:
        mxnet.symbol.Symbol
    """
    return _dump(_strip(_load(sym), unpin=True))


def cast_origins(sym):
    """Every cast node of ``sym`` with who wrote it (:func:`cast_origin`).

    Args:
        sym (mxnet.symbol.Symbol): any graph.

    Returns:
        list of ``(node name, op, origin)`` in topological order; origin is ``'mxmp'``,
        ``'contrib.amp'`` or ``'model'``.
    """
    rows = []
    for node in _load(sym)['nodes']:
        origin = cast_origin(node)
        if origin is not None:
            rows.append((node['name'], node['op'], origin))
    return rows


def converted_dtype(sym):
    """The target dtype an mxmp-converted graph was converted to, or None for other graphs
    (float32 graphs, graphs with model casts only, graphs converted by ``mxnet.contrib.amp``).

    Raises:
        ValueError: the graph holds mxmp casts to both float16 and bfloat16.
    """
    return _previous_conversion(_load(sym))


def _previous_conversion(js):
    dtypes = set()
    for node in js['nodes']:
        attrs = node.get('attrs', {})
        if node['op'] in _CAST_OPS and attrs.get(MARK) is not None:
            if attrs.get('dtype') in _LOW:
                dtypes.add(attrs['dtype'])
        elif ROUND_MARK in attrs:
            dtypes.add(attrs[ROUND_MARK])
        elif node['op'] == 'null' and attrs.get(MARK, '').startswith('cast_param'):
            dtypes.add({v: k for k, v in _MSHADOW_ENUM.items()}[attrs['__dtype__']])
    if len(dtypes) > 1:
        raise ValueError('the graph mixes mxmp casts to %s; strip them with mxmp.remove_casts'
                         % ' and '.join(sorted(dtypes)))
    return dtypes.pop() if dtypes else None


def count_casts(sym):
    """Count cast nodes in ``sym``: dict ``{'amp_cast': n, 'amp_multicast': m}``."""
    counts = {op: 0 for op in _CAST_OPS}
    for node in _load(sym)['nodes']:
        if node['op'] in counts:
            counts[node['op']] += 1
    return counts
