"""The pass's kernel rule: MXNet ops whose 1.9.1 CPU kernel is slow are replaced by the op of
mxmp's operator library that computes the same function (:mod:`mxmp._src.kernels`), before
the plan, where the library builds and loads. :func:`restore` undoes it (``remove_casts``).

One substitution so far, from the BERT-base training profile (docs/benchmark.md,
"Transformers"): ``LayerNorm`` over the last axis (``axis=-1``, the default), without
``output_mean_var``, becomes ``mxmp_layer_norm`` (float32 or float64, as LayerNorm in the
policy). MXNet passes a library op no write/add request, so the library op always writes its
gradients: each graph variable it reads goes through a ``_copy`` the rule adds (marked), whose
MXNet backward honours ``grad_req='add'``; and with ``MXNET_EXEC_ENABLE_ADDTO=1`` (gradients of
intermediate tensors accumulated in place) the rule stays off.

It is on for bfloat16 targets (a CPU dtype: the library has CPU kernels only) and off with
``Policy(kernels='mxnet')`` or ``MXMP_KERNELS=mxnet``; :func:`mxmp.explain` names it.
"""
import logging
import os

from .symbol_json import MARK, unique_name

__all__ = ['KERNEL_PREFIX', 'INPUT_COPY', 'substitute', 'restore', 'rule_of']

logger = logging.getLogger('mxmp.kernels')

#: MARK value prefix of a substituted node; the original op name follows.
KERNEL_PREFIX = 'kernel:'
#: MARK value of a ``_copy`` the rule puts between a variable and a library op.
INPUT_COPY = 'kernel_input'
#: MXNet op -> library op.
SUBSTITUTES = {'LayerNorm': 'mxmp_layer_norm'}
_TRUE = ('1', 'true', 'True')


def _eligible(node, used_outputs):
    """Whether ``node`` (graph JSON) is one the rule replaces."""
    if node['op'] != 'LayerNorm' or len(node['inputs']) != 3:
        return False
    attrs = node.get('attrs', {})
    return (attrs.get('axis', '-1') == '-1' and attrs.get('output_mean_var', 'False') not in _TRUE
            and not used_outputs & {1, 2})


def substitute(js, policy):
    """``js`` (graph JSON) with the kernel rule applied (module docstring): a new dict, or
    ``js`` itself where nothing applies or the library is unavailable."""
    if policy.kernels == 'mxnet' or policy.target_dtype != 'bfloat16':
        return js
    nodes = js['nodes']
    used = {}
    for node in nodes:
        for src, idx, _ in node['inputs']:
            used.setdefault(src, set()).add(idx)
    for src, idx, _ in js['heads']:
        used.setdefault(src, set()).add(idx)
    chosen = {nid for nid, n in enumerate(nodes) if _eligible(n, used.get(nid, set()))}
    if not chosen:
        return js
    if os.environ.get('MXNET_EXEC_ENABLE_ADDTO', '0') not in ('', '0'):
        logger.warning('mxmp: MXNET_EXEC_ENABLE_ADDTO is set: LayerNorm keeps MXNet\'s kernel '
                       '(library ops cannot add to a gradient in place)')
        return js
    from ..kernels.build import load_library
    if load_library() is None:
        return js
    names = {n['name'] for n in nodes}
    out, new_id = [], {}
    for nid, node in enumerate(nodes):
        inputs = [[new_id[s], i, v] for s, i, v in node['inputs']]
        if nid in chosen:
            for pos, (src, _, _) in enumerate(node['inputs']):
                if nodes[src]['op'] == 'null':
                    out.append({'op': '_copy', 'attrs': {MARK: INPUT_COPY}, 'inputs': [inputs[pos]],
                                'name': unique_name('%s_%s_copy' % (node['name'],
                                                                    nodes[src]['name']), names)})
                    inputs[pos] = [len(out) - 1, 0, 0]
            attrs = dict(node.get('attrs', {}), **{MARK: KERNEL_PREFIX + node['op']})
            node = dict(node, op=SUBSTITUTES[node['op']], attrs=attrs)
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
    return dict(js, nodes=out, heads=[[new_id[s], i, v] for s, i, v in js['heads']])


def restore(node):
    """The original form of a node the rule wrote: ``'input'`` for an added ``_copy`` (it stands
    for its input), a new node dict with the original op, or None for other nodes."""
    mark = node.get('attrs', {}).get(MARK, '') if node['op'] != 'null' else ''
    if mark == INPUT_COPY:
        return 'input'
    if not mark.startswith(KERNEL_PREFIX):
        return None
    attrs = {k: v for k, v in node['attrs'].items() if k != MARK}
    new = dict(node, op=mark[len(KERNEL_PREFIX):], attrs=attrs)
    if not attrs:
        new.pop('attrs')
    return new


def rule_of(node):
    """The explain rule (str) of a node the kernel rule wrote, or None."""
    mark = node.get('attrs', {}).get(MARK, '') if node['op'] != 'null' else ''
    if mark == INPUT_COPY:
        return ("kernel rule: input copy of an mxmp library op (MXNet's copy accumulates "
                "grad_req='add')")
    if mark.startswith(KERNEL_PREFIX):
        return ("kernel rule: %s as %s, mxmp's library kernel (Policy(kernels='mxnet') keeps "
                "MXNet's)" % (mark[len(KERNEL_PREFIX):], node['op']))
    return None
