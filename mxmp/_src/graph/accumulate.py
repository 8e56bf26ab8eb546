"""Gradient accumulation (``grad_req='add'``) through a converted graph.

MXNet 1.9.1's backward of ``amp_cast`` (to bfloat16, or float32 to float32), of
``amp_multicast`` and of ``clip`` ignores ``req=kAddTo``: when such a node reads a variable
directly, the variable's gradient is overwritten (``clip``: the last backward's only) or
left at zero (``amp_cast``/``amp_multicast``: nothing is written) instead of accumulated, on
every CPU ISA (measured with ``autograd`` and ``attach_grad(grad_req='add')``, two backward
passes: docs/from_contrib_amp.md "Gradient accumulation"). ``amp_cast`` to float16 and the
elementwise ops honour it. A converted graph reads each float32 parameter through such a
node (its cast to the target dtype, or the first node of bfloat16 emulation's rounding), so
without this guard a BERT fine-tuning loop that accumulates gradients over batches
(GluonNLP's ``finetune_classifier.py --accumulate``) updates its dense layers with zero or
last-batch gradients. :func:`guard_accumulated_grads` puts an ``identity`` (``_copy``, whose
backward adds) between such a variable and those consumers.
"""
from .symbol_json import MARK, dump, load, unique_name

__all__ = ['KADDTO_IGNORED_OPS', 'ACCUMULATE', 'guard_accumulated_grads', 'accumulating_names']

#: Operators whose backward in MXNet 1.9.1 ignores ``req=kAddTo`` for the gradient of input 0
#: (amp_multicast: of every input).
KADDTO_IGNORED_OPS = ('amp_cast', 'amp_multicast', 'clip')
#: :data:`MARK` value of the identity nodes :func:`guard_accumulated_grads` adds (removed by
#: ``remove_casts`` with mxmp's casts).
ACCUMULATE = 'accumulate'


def guard_accumulated_grads(sym, names):
    """``sym`` with an identity node between each variable named in ``names`` (the
    parameters whose gradients accumulate: ``grad_req='add'``) and its consumers among
    :data:`KADDTO_IGNORED_OPS`; ``sym`` itself when there is none. Same outputs, same values."""
    js = load(sym)
    nodes = js['nodes']
    guarded = {nid for nid, node in enumerate(nodes)
               if node['op'] == 'null' and node['name'] in names and any(
                   user['op'] in KADDTO_IGNORED_OPS and any(e[0] == nid for e in user['inputs'])
                   for user in nodes)}
    if not guarded:
        return sym
    taken = {n['name'] for n in nodes}
    out, new_id, copy_id = [], {}, {}
    for nid, node in enumerate(nodes):
        node = dict(node)
        if node['op'] in KADDTO_IGNORED_OPS:
            node['inputs'] = [[copy_id[e[0]], 0, 0] if e[0] in copy_id else
                              [new_id[e[0]], e[1], e[2]] for e in node['inputs']]
        else:
            node['inputs'] = [[new_id[e[0]], e[1], e[2]] for e in node['inputs']]
        new_id[nid] = len(out)
        out.append(node)
        if nid in guarded:
            copy_id[nid] = len(out)
            out.append({'op': '_copy', 'name': unique_name(node['name'] + '_accumulate', taken),
                        'attrs': {MARK: ACCUMULATE}, 'inputs': [[new_id[nid], 0, 0]]})
    heads = [[new_id[h[0]], h[1], h[2]] for h in js['heads']]
    return dump(dict(js, nodes=out, heads=heads))


def accumulating_names(sym, grad_req):
    """The argument names of ``sym`` whose gradients accumulate under ``grad_req`` (a str for
    every argument, a dict name -> req, or a list in ``sym.list_arguments()`` order, as
    ``Module.bind`` takes it)."""
    if isinstance(grad_req, str):
        return set(sym.list_arguments()) if grad_req == 'add' else set()
    if isinstance(grad_req, dict):
        return {name for name, req in grad_req.items() if req == 'add'}
    return {name for name, req in zip(sym.list_arguments(), grad_req) if req == 'add'}
