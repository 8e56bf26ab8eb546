"""Cast nodes in an MXNet Symbol: read and write the graph JSON, find, count and remove casts.

The small, pass-independent half of :mod:`mxmp.graph`: the attribute keys that mark what mxmp
wrote (:data:`MARK`, :data:`ROUND_MARK`), :func:`remove_casts` (the float32 graph back),
:func:`converted_dtype` (the target dtype a graph was converted to) and :func:`count_casts`.
``amp_cast``/``amp_multicast`` are MXNet 1.9.1's cast operators
(``src/operator/tensor/amp_cast.cc``); mshadow's dtype enum (``include/mshadow/base.h``:
float16=2, bfloat16=12) is what a variable's ``__dtype__`` attribute holds.
"""
import json

import numpy as np

__all__ = ['MARK', 'ROUND_MARK', 'remove_casts', 'converted_dtype', 'count_casts']

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


def _strip(js):
    """Remove every amp_cast/amp_multicast node, mxmp's bfloat16 rounding nodes and mxmp's
    parameter dtypes (pure, on JSON)."""
    nodes = js['nodes']
    resolve = {}  # (old nid, out idx) -> (old nid, out idx) of a kept node
    keep = []
    for nid, node in enumerate(nodes):
        if node['op'] in _CAST_OPS or ROUND_MARK in node.get('attrs', {}):
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
    """Return the float32 graph: ``sym`` without any ``amp_cast``/``amp_multicast`` node.

    Consumers of a cast are rewired to the cast's input; variables whose dtype mxmp set
    (``cast_params=True``) lose that dtype. Casts written by ``mxnet.contrib.amp`` go too.
    ``remove_casts(convert_symbol(g))`` gives back ``g`` exactly (same nodes, names, attrs).

    Args:
        sym (mxnet.symbol.Symbol): any graph.

    Returns:
        mxnet.symbol.Symbol
    """
    return _dump(_strip(_load(sym)))


def converted_dtype(sym):
    """The target dtype an mxmp-converted graph was converted to, or None for other graphs.

    Raises:
        ValueError: the graph holds cast nodes that mxmp did not write (e.g. from
            ``mxnet.contrib.amp``).
    """
    return _previous_conversion(_load(sym))


def _previous_conversion(js):
    dtypes, foreign = set(), []
    for node in js['nodes']:
        if node['op'] in _CAST_OPS:
            attrs = node.get('attrs', {})
            if attrs.get(MARK) is None:
                foreign.append(node['name'])
            elif attrs.get('dtype') in _LOW:
                dtypes.add(attrs['dtype'])
        elif ROUND_MARK in node.get('attrs', {}):
            dtypes.add(node['attrs'][ROUND_MARK])
        elif node['op'] == 'null' and node.get('attrs', {}).get(MARK, '').startswith('cast_param'):
            dtypes.add({v: k for k, v in _MSHADOW_ENUM.items()}[node['attrs']['__dtype__']])
    if foreign:
        raise ValueError(
            'the graph already holds cast nodes that mxmp did not write (%s%s), e.g. from '
            'mxnet.contrib.amp; convert the float32 graph, or strip them first with '
            'mxmp.remove_casts(sym)' % (', '.join(foreign[:3]), ', ...' if len(foreign) > 3
                                         else ''))
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
