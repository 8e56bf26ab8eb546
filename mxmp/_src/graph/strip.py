"""Casts already in a graph (remove, count, who wrote them, to what dtype), and the parameter
arrays that go with a converted or stripped graph."""
import numpy as np

from ..dtypes import LOW_PRECISION_DTYPES, from_mshadow_enum, mx_dtype
from .kernel_rule import restore
from .symbol_json import (CAST_OPS, FLOAT_DTYPES, MARK, NAME_MARK, ROUND_MARK, STEM_MARK,
    STEM_SHAPE, cast_origin, dump, is_cast_param, load, original_dtype)

__all__ = ['remove_casts', 'converted_dtype', 'count_casts', 'strip',
           'float32_arrays', 'arrays_for_graph', 'without_library_ops', 'write_mxnet_ops']


def _restore(node, attrs, mark, key, original):
    """Set ``node``'s attrs to ``attrs`` without ``mark``, with the ``original`` value of ``key``
    (none: without it); return them."""
    attrs = {k: v for k, v in attrs.items() if k not in (mark, key)}
    if original:
        attrs[key] = original
    if attrs:
        node['attrs'] = attrs
    else:
        node.pop('attrs')
    return attrs


def strip(js, unpin=False):
    """A new graph JSON without mxmp's and contrib.amp's casts, mxmp's rounding nodes, stem
    padding and parameter dtypes; model casts stay. ``unpin``: in a graph with contrib.amp
    casts, variables contrib.amp stored in low precision become float32 too."""
    from . import concat_rule   # loaded by the first use, not by `import mxmp`
    from .reduce_rule import restore_graph
    js = restore_graph(concat_rule.restore_graph(js))
    nodes = js['nodes']
    contrib = unpin and any(cast_origin(n) == 'contrib.amp' for n in nodes)
    resolve = {}  # (old nid, out idx) -> (old nid, out idx) of a kept node
    keep = []
    originals = {}  # nid -> the node the kernel rule replaced
    for nid, node in enumerate(nodes):
        kernel = restore(node)
        if kernel == 'input':   # the kernel rule's copy of a variable stands for it
            src, idx, _ = node['inputs'][0]
            resolve[(nid, 0)] = resolve.get((src, idx), (src, idx))
            continue
        if kernel == 'drop':   # the kernel rule's training-mode flag: read by its ops only
            continue
        if kernel is not None:
            from .selfatt_pair import pair_source   # not loaded by `import mxmp`
            from .ln_copy import COPY, has_copy
            if pair_source(node) is not None:   # a self-attention pair's values: qkv again
                src, idx, _ = pair_source(node)
                resolve[(nid, 1)] = resolve.get((src, idx), (src, idx))
            if has_copy(node):   # a LayerNorm copy: the LayerNorm's output again
                resolve[(nid, COPY)] = (nid, 0)
            originals[nid] = node = kernel
        if node['op'] != 'null' and STEM_MARK in node.get('attrs', {}):
            # the stem padding (mxmp._src.graph.stem): its Concat stands for the unpadded tensor
            if node['op'] == 'Concat':
                src, idx, _ = node['inputs'][0]
                resolve[(nid, 0)] = resolve.get((src, idx), (src, idx))
        elif cast_origin(node) in ('mxmp', 'contrib.amp'):
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
        node = dict(originals.get(old, nodes[old]))
        node['inputs'] = [remap(e) for e in node['inputs']]
        attrs = node.get('attrs')
        if attrs and attrs.get(STEM_MARK, '').startswith(STEM_SHAPE):
            attrs = _restore(node, attrs, STEM_MARK, '__shape__',
                             attrs[STEM_MARK][len(STEM_SHAPE):])
        if attrs and NAME_MARK in attrs:   # its name, which a cast took as an output name
            node['name'] = attrs[NAME_MARK]
            attrs = _restore(node, attrs, NAME_MARK, NAME_MARK, None)
        if original_dtype(node) is not None:
            _restore(node, attrs, MARK, '__dtype__', original_dtype(node))
        elif contrib and node['op'] == 'null' and attrs and \
                from_mshadow_enum(attrs.get('__dtype__')) in LOW_PRECISION_DTYPES:
            node['attrs'] = dict(attrs, __dtype__='0')   # float32, as contrib.amp writes it
        out_nodes.append(node)
    return dict(js, nodes=out_nodes, heads=[remap(h) for h in js['heads']])


def remove_casts(sym):
    """The float32 graph (Symbol) of ``sym`` (any Symbol): ``remove_casts(convert_symbol(g))``
    is ``g`` exactly.

    Removes the casts mxmp or ``mxnet.contrib.amp`` wrote (:func:`cast_origin`), mxmp's rounding
    nodes and stem padding, and the low-precision ``__dtype__`` of variables mxmp or contrib.amp
    stored in low precision (their arrays must be cast to float32). The model's own casts stay.
    """
    return dump(strip(load(sym), unpin=True))


def without_library_ops(sym):
    """``sym`` (a converted Symbol) with MXNet's own ops in place of those of mxmp's library
    (:func:`mxmp._src.graph.kernel_undo.mxnet_ops`; casts and stored dtypes stay): the graph
    mxmp writes to files, which plain MXNet loads. ``sym`` itself where it holds none."""
    js = load(sym)
    from .kernel_undo import mxnet_ops   # not loaded by `import mxmp`
    out = mxnet_ops(js)
    return sym if out is js else dump(out)


def write_mxnet_ops(path):
    """Rewrite the graph file ``path`` (JSON) with MXNet's own ops in place of those of mxmp's
    library, atomically (:func:`without_library_ops`); unchanged where it holds none."""
    import json
    from ..files import write_atomic
    with open(path) as f:
        js = json.load(f)
    from .kernel_undo import mxnet_ops   # not loaded by `import mxmp`
    out = mxnet_ops(js)
    if out is not js:
        out = dict(out, arg_nodes=[i for i, n in enumerate(out['nodes']) if n['op'] == 'null'])
        out.pop('node_row_ptr', None)
        write_atomic(path, json.dumps(out, indent=2))


def converted_dtype(sym):
    """The target dtype an mxmp-converted graph (a Symbol or its JSON dict) was converted to,
    or None for other graphs (float32 graphs, graphs with model casts only, graphs converted by
    ``mxnet.contrib.amp``).

    Raises:
        ValueError: the graph holds mxmp casts to both float16 and bfloat16.
    """
    dtypes = set()
    for node in (sym if isinstance(sym, dict) else load(sym))['nodes']:
        attrs = node.get('attrs', {})
        if node['op'] in CAST_OPS and attrs.get(MARK) is not None and \
                attrs.get('dtype') in LOW_PRECISION_DTYPES:
            dtypes.add(attrs['dtype'])
        elif ROUND_MARK in attrs:
            dtypes.add(attrs[ROUND_MARK])
        elif is_cast_param(node):
            dtypes.add(from_mshadow_enum(attrs['__dtype__']))
    if len(dtypes) > 1:
        raise ValueError('the graph mixes mxmp casts to %s; strip them with mxmp.remove_casts'
                         % ' and '.join(sorted(dtypes)))
    return dtypes.pop() if dtypes else None


def count_casts(sym):
    """Count cast nodes in ``sym``: dict ``{'amp_cast': n, 'amp_multicast': m}``."""
    counts = {op: 0 for op in CAST_OPS}
    for node in load(sym)['nodes']:
        if node['op'] in counts:
            counts[node['op']] += 1
    return counts


def float32_arrays(arrays):
    """A new dict: every NDArray of ``arrays`` (dict of str -> NDArray) in float32 (float32
    arrays are the same objects; others are cast with ``amp_cast``)."""
    return _cast_arrays(arrays, {})


def arrays_for_graph(sym, arrays):
    """A new dict: each NDArray of ``arrays`` (named as ``sym``'s variables) in the dtype the
    converted graph ``sym`` gives its variable (``__dtype__``: the target dtype where the graph
    stores it so), float32 where it gives none; cast with ``amp_cast``, others the same objects."""
    return _cast_arrays(arrays, {n['name']: from_mshadow_enum(n.get('attrs', {}).get('__dtype__'))
                                 for n in load(sym)['nodes'] if n['op'] == 'null'})


def _cast_arrays(arrays, dtypes):
    import mxnet as mx
    from ..device import to_default_layout
    out = {}
    for name, value in arrays.items():
        dtype = mx_dtype(dtypes[name] if dtypes.get(name) in FLOAT_DTYPES else 'float32')
        if np.dtype(value.dtype) != np.dtype(dtype):
            to_default_layout([value])   # amp_cast fails on weights oneDNN reordered in place
            value = mx.nd.amp_cast(value, dtype=dtype)
        out[name] = value
    return out
