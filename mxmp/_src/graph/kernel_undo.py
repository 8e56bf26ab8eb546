"""Undoing the kernel rule (:mod:`.kernel_rule`): MXNet's own ops back in place of the library's
in every file mxmp writes (:func:`mxnet_ops`) and in inference-only graphs where MXNet's op
costs nothing (:func:`inference_only`), and the graph loaders that load the library first for
a graph that holds its ops (:func:`install_symbol_loaders`, run by ``import mxmp``).
"""
from .kernel_rule import ATTENTION, FLAG, kernel_dtype, original_op, restore
from .symbol_json import MARK, unique_name

__all__ = ['inference_only', 'mxnet_ops', 'install_symbol_loaders']


def _undo(js, undo, bypass=lambda node: False):
    """``js`` with the rule's nodes for which ``undo(node, restored)`` is true put back
    (copies read their input again, flags dropped once no library op reads them; a library
    node marked low precision comes back in float32 between two casts), and the library nodes
    for which ``bypass(node)`` is true replaced by their data input."""
    nodes = js['nodes']
    names = {n['name'] for n in nodes}
    out, new_id, resolve = [], {}, {}

    def entry(src, idx, version):
        return (resolve[src] + [version] if src in resolve and idx == 0 else
                [new_id[src], idx, version])

    def cast(src, dtype, base):   # marked as the pass's: remove_casts strips it
        out.append({'op': 'amp_cast', 'name': unique_name('%s_amp_cast_%s' % (base, dtype), names),
                    'attrs': {MARK: 'cast', 'dtype': dtype}, 'inputs': [src]})
        return [len(out) - 1, 0, 0]

    for nid, node in enumerate(nodes):
        back = restore(node)
        if back is not None and not undo(node, back):
            back = None
        if back == 'drop':
            continue
        if back == 'input' or (isinstance(back, dict) and bypass(node)):
            src, idx, _ = node['inputs'][0]
            resolve[nid] = resolve[src] if src in resolve and idx == 0 else [new_id[src], idx]
            continue
        low = kernel_dtype(node) if isinstance(back, dict) else None
        if isinstance(back, dict):
            node = back
        inputs = [entry(s, i, v) for s, i, v in node['inputs']]
        if low is not None:   # MXNet's op in float32 between two casts (low data inputs:
            for k in range(len(inputs)) if node['op'] in ATTENTION else (0,):   # all, or 0)
                inputs[k] = cast(inputs[k], 'float32', node['name'])
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
        if low is not None:   # the rule substitutes nodes whose other outputs are not read
            resolve[nid] = cast([len(out) - 1, 0, 0], low, node['name'])[:2]
    heads = [entry(s, i, v) for s, i, v in js['heads']]
    return dict(js, nodes=out, heads=heads)


def inference_only(js):
    """``js`` (a converted graph's JSON) for a graph that only runs inference (the oneDNN-fused
    twin, :func:`mxmp.freeze`): the rule's ``mxmp_dropout`` nodes back to MXNet's Dropout, which
    MXNet runs as the identity in inference at no cost (the library op copies), and the flag
    removed; a bfloat16 one in the default mode (no bfloat16 Dropout in MXNet) is removed (its
    consumers read its input). A new dict, or ``js`` where there is nothing to undo."""
    if not any(n.get('attrs', {}).get(MARK) == FLAG for n in js['nodes']):
        return js
    return _undo(js, lambda node, back: node.get('attrs', {}).get(MARK) == FLAG or
                 isinstance(back, dict) and back['op'] == 'Dropout',
                 bypass=lambda node: original_op(node) == 'Dropout' and
                 kernel_dtype(node) is not None and
                 node['attrs'].get('mode', 'training') != 'always')


def mxnet_ops(js):
    """``js`` (graph JSON) with every node of the rule undone: MXNet's own ops in place of the
    library's (same attributes, float32; between casts where the library op ran in bfloat16),
    the input copies and the training flag gone; casts and stored dtypes stay. What every file
    mxmp writes holds unless the user asks for the library ops: plain MXNet loads it. A new
    dict, or ``js`` where the rule wrote nothing."""
    if not any(restore(n) is not None for n in js['nodes']):
        return js
    return _undo(js, lambda node, back: True)


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
