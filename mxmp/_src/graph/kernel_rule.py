"""The pass's kernel rule: MXNet ops whose 1.9.1 CPU kernel is slow are replaced by the op of
mxmp's operator library that computes the same function (:mod:`mxmp._src.kernels`), before
the plan, where the library builds and loads. :func:`restore` undoes it (``remove_casts``).

Substitutions, from the BERT-base training profile (docs/benchmark.md, "Transformers"):

- ``LayerNorm`` over the last axis (``axis=-1``, the default), without ``output_mean_var``,
  becomes ``mxmp_layer_norm`` (float32 or float64, as LayerNorm in the policy).
- ``softmax`` with lengths (``use_length=True``, GluonNLP's attention mask) over the last
  axis, without ``temperature`` or ``dtype``, becomes ``mxmp_softmax`` (MXNet runs its generic
  kernel there; without lengths it runs oneDNN's, which stays).
- ``Dropout`` without ``axes``, ``0 < p < 1``, becomes ``mxmp_dropout`` (same mask semantics:
  zero with probability p, kept values scaled by 1/(1-p), identity in inference unless
  ``mode='always'``; the mask from a counter-based hash instead of MXNet's generator). MXNet
  does not tell a library op whether it runs in training: the rule adds one flag per graph,
  MXNet's own Dropout (p=0.5) of a constant 1, which is 1 exactly in inference and 0 or 2 in
  training, and every ``mxmp_dropout`` reads it.

MXNet passes a library op no write/add request, so the library op always writes its
gradients: each graph variable it reads goes through a ``_copy`` the rule adds (marked), whose
MXNet backward honours ``grad_req='add'``; and with ``MXNET_EXEC_ENABLE_ADDTO=1`` (gradients of
intermediate tensors accumulated in place) the rule stays off.

It is on for bfloat16 targets (a CPU dtype: the library has CPU kernels only) and off with
``Policy(kernels='mxnet')`` or ``MXMP_KERNELS=mxnet``; :func:`mxmp.explain` names it.
"""
import logging
import os

from .symbol_json import MARK, unique_name

__all__ = ['KERNEL_PREFIX', 'INPUT_COPY', 'substitute', 'apply_kernels', 'restore', 'rule_of',
           'inference_only']

logger = logging.getLogger('mxmp.kernels')

#: MARK value prefix of a substituted node; the original op name follows.
KERNEL_PREFIX = 'kernel:'
#: MARK value of a ``_copy`` the rule puts between a variable and a library op.
INPUT_COPY = 'kernel_input'
#: MARK value of the training-mode flag's nodes (a constant 1 and MXNet's Dropout of it).
FLAG = 'kernel_flag'
#: MXNet op -> library op.
SUBSTITUTES = {'LayerNorm': 'mxmp_layer_norm', 'Dropout': 'mxmp_dropout',
               'softmax': 'mxmp_softmax'}
#: Ops substituted only under ``Policy(kernels='all')`` (none now). Dropout was, until the
#: transformer study's +1.2% perplexity with it was traced to its other masks: float32 with the
#: library Dropout lands where float32 with MXNet's Dropout reseeded does, and bfloat16 with it
#: matches float32 with it (docs/accuracy.md, "mxmp's Dropout kernel").
OPT_IN = ()
#: Inputs of the MXNet op (the library op may take more: Dropout's flag).
_N_INPUTS = {'LayerNorm': 3, 'Dropout': 1, 'softmax': 2}
#: Inputs that get no copy: integer lengths, whose gradient is zero.
_NO_COPY = {'softmax': (1,)}
_TRUE = ('1', 'true', 'True')


def _eligible(node, used_outputs):
    """Whether ``node`` (graph JSON) is one the rule replaces."""
    op, attrs = node['op'], node.get('attrs', {})
    if op not in SUBSTITUTES or len(node['inputs']) != _N_INPUTS[op]:
        return False
    if op == 'softmax':
        return (attrs.get('use_length', 'False') in _TRUE and attrs.get('axis', '-1') == '-1'
                and attrs.get('temperature', 'None') in ('None', '1', '1.0')
                and attrs.get('dtype', 'None') == 'None' and not used_outputs - {0})
    if op == 'LayerNorm':
        return (attrs.get('axis', '-1') == '-1' and
                attrs.get('output_mean_var', 'False') not in _TRUE and not used_outputs & {1, 2})
    try:
        p = float(attrs.get('p', '0.5'))
    except ValueError:
        return False
    return (0 < p < 1 and attrs.get('axes', '()') in ('()', '[]', '(,)') and
            not used_outputs - {0})


def _flag_nodes(names):
    """The training-mode flag (module docstring): a constant 1 and MXNet's Dropout of it."""
    one = {'op': '_ones', 'name': unique_name('mxmp_train_flag_one', names),
           'attrs': {'shape': '(1,)', 'dtype': 'float32', MARK: FLAG}, 'inputs': []}
    flag = {'op': 'Dropout', 'name': unique_name('mxmp_train_flag', names),
            'attrs': {'p': '0.5', 'mode': 'training', MARK: FLAG}, 'inputs': None}
    return one, flag


def substitute(js, policy):
    """``js`` (graph JSON) with the kernel rule applied (module docstring): a new dict, or
    ``js`` itself where nothing applies or the library is unavailable."""
    if policy.kernels == 'mxnet' or policy.target_dtype != 'bfloat16':
        return js
    return apply_kernels(js, policy.kernels)


def apply_kernels(js, kernels):
    """The rule's rewrite of ``js`` (graph JSON, dict) whatever its dtypes: ``kernels`` is
    ``'auto'`` (the default set) or ``'all'`` (also :data:`OPT_IN`). :func:`substitute` calls
    it for bfloat16 targets; the transformer study calls it on a float32 graph to measure the
    library's kernels without the precision (``python -m benchmarks.gpt --kernels all``).
    Returns a new dict, or ``js`` where nothing applies or the library is unavailable."""
    if kernels not in ('auto', 'all'):
        raise ValueError("kernels must be 'auto' or 'all', got %r" % (kernels,))
    nodes = js['nodes']
    used = {}
    for node in nodes:
        for src, idx, _ in node['inputs']:
            used.setdefault(src, set()).add(idx)
    for src, idx, _ in js['heads']:
        used.setdefault(src, set()).add(idx)
    chosen = {nid for nid, n in enumerate(nodes) if _eligible(n, used.get(nid, set()))
              and (kernels == 'all' or n['op'] not in OPT_IN)}
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
    out, new_id, flag = [], {}, None
    for nid, node in enumerate(nodes):
        inputs = [[new_id[s], i, v] for s, i, v in node['inputs']]
        if nid in chosen and node['op'] == 'Dropout':
            if flag is None:
                one, dropout = _flag_nodes(names)
                out.append(one)
                out.append(dict(dropout, inputs=[[len(out) - 1, 0, 0]]))
                flag = [len(out) - 1, 0, 0]
            inputs.append(flag)
        if nid in chosen:
            for pos, (src, _, _) in enumerate(node['inputs']):
                if nodes[src]['op'] == 'null' and pos not in _NO_COPY.get(node['op'], ()):
                    name = unique_name('%s_%s_copy' % (node['name'], nodes[src]['name']), names)
                    out.append({'op': '_copy', 'attrs': {MARK: INPUT_COPY},
                                'inputs': [inputs[pos]], 'name': name})
                    inputs[pos] = [len(out) - 1, 0, 0]
            attrs = dict(node.get('attrs', {}), **{MARK: KERNEL_PREFIX + node['op']})
            node = dict(node, op=SUBSTITUTES[node['op']], attrs=attrs)
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
    return dict(js, nodes=out, heads=[[new_id[s], i, v] for s, i, v in js['heads']])


def restore(node):
    """The original form of a node the rule wrote: ``'input'`` for an added ``_copy`` (it stands
    for its input), ``'drop'`` for the flag's nodes, a new node dict with the original op (and
    inputs), or None for other nodes."""
    mark = node.get('attrs', {}).get(MARK, '') if node['op'] != 'null' else ''
    if mark in (INPUT_COPY, FLAG):
        return 'input' if mark == INPUT_COPY else 'drop'
    if not mark.startswith(KERNEL_PREFIX):
        return None
    attrs = {k: v for k, v in node['attrs'].items() if k != MARK}
    op = mark[len(KERNEL_PREFIX):]
    new = dict(node, op=op, attrs=attrs, inputs=node['inputs'][:_N_INPUTS.get(op, 99)])
    if not attrs:
        new.pop('attrs')
    return new


def rule_of(node):
    """The explain rule (str) of a node the kernel rule wrote, or None."""
    mark = node.get('attrs', {}).get(MARK, '') if node['op'] != 'null' else ''
    if mark == INPUT_COPY:
        return ("kernel rule: input copy of an mxmp library op (MXNet's copy accumulates "
                "grad_req='add')")
    if mark == FLAG:
        return ('kernel rule: training-mode flag of mxmp_dropout (1 in inference, 0 or 2 in '
                'training)')
    if mark.startswith(KERNEL_PREFIX):
        return ("kernel rule: %s as %s, mxmp's library kernel (Policy(kernels='mxnet') keeps "
                "MXNet's)" % (mark[len(KERNEL_PREFIX):], node['op']))
    return None


def inference_only(js):
    """``js`` (a converted graph's JSON) for a graph that only runs inference (the oneDNN-fused
    twin): the rule's ``mxmp_dropout`` nodes back to MXNet's Dropout, which MXNet runs as the
    identity in inference at no cost (the library op copies), and the flag removed. A new
    dict, or ``js`` where there is nothing to undo."""
    nodes = js['nodes']
    if not any(restore(n) == 'drop' for n in nodes):
        return js
    out, new_id = [], {}
    for nid, node in enumerate(nodes):
        back = restore(node)
        if back == 'drop':
            continue
        if isinstance(back, dict) and back['op'] == 'Dropout':
            node = back
        out.append(dict(node, inputs=[[new_id[s], i, v] for s, i, v in node['inputs']]))
        new_id[nid] = len(out) - 1
    return dict(js, nodes=out, heads=[[new_id[s], i, v] for s, i, v in js['heads']])
