"""The pass's reduction rule: a float32 ``sum`` or ``mean`` over trailing axes computed as a
FullyConnected product with a vector of ones (a float32 matrix-vector product in oneDNN)
instead of MXNet 1.9.1's CPU reduction kernel.

Why: MXNet 1.9.1's CPU reduction (``sum``, ``mean``, and the reduction in the backward of a
broadcast op; Kahan-compensated, one element at a time through ``volatile`` temporaries:
``red::sum`` in the wheel's include/mshadow/base.h) takes about 4.6 ns per element on one Zen 5
core, 25-40x a matrix-vector product
over the same values: on (32, 40, 32000) float32, ``sum(axis=-1)`` 190 ms against 5.0 ms for
``FullyConnected`` with a (1, 32000) weight of ones, ``mean(axis=0, exclude=True)`` 188 ms
against 7.6 ms (docs/benchmark.md, "The encoder-decoder transformer"). A loss over a large
vocabulary (GluonNLP's label-smoothed ``MaskedSoftmaxCELoss``, Gluon's ``SoftmaxCELoss`` with
dense labels) runs such reductions over batch x length x vocabulary values every step, in
float32 in both precisions: with bfloat16 matrix products they are a large share of the step.

Which nodes: ``sum`` and ``mean`` of float32 data (float32 ops in the policy, and the rule keeps
them float32; integer and float64 reductions keep MXNet's kernel)

- over the last axis (``axis=-1``, any ``keepdims``): ``r = Reshape(x, (-1, 0), reverse)``
  (rows x last axis), ``w = ones_like(slice_axis(r, 0, 0, 1))`` (1 x last axis),
  ``y = FullyConnected(x, w, no_bias, num_hidden=1, flatten=False)`` (x's shape with the last
  axis 1, for any ndim);
- over every axis but the first (``axis=0, exclude=True``, ``keepdims=False``): the same on
  ``expand_dims(x, 1)`` (so that a 1-D ``x``, which MXNet returns unchanged, stays so), which
  reduces the last axis only; the original node reduces the other axes with MXNet's kernel.

``mean`` divides that by ``sum(w)`` (the count of reduced values). The original node then
reduces the result's size-1 axes with its own attributes (name and output shape unchanged,
one value per output). Shapes are never needed at conversion: every helper takes its shape
from ``x`` at run time, so the graph serves every batch and sequence length.

Numerics: the same float32 sum in oneDNN's order, uncompensated: relative error against
float64 up to 8e-7 over 32,000 positive values (MXNet's Kahan sum 3e-8), and 8e-6 on the
label-smoothed loss above (docs/pass.md, "Reduction rule", has the measurements). The
gradient into ``x`` is the output gradient times 1.0 (``mean``: divided by the count), as
MXNet's.

It is on for bfloat16 targets (the slow kernel is MXNet's CPU kernel) and off with
``Policy(reductions='mxnet')``; a ``sum``/``mean`` the user names in ``lp_ops`` or
``follow_ops`` keeps MXNet's reduction in the user's class; :func:`mxmp.explain` names every
node it writes (:func:`rule_of`);
:func:`restore_graph` undoes it (``remove_casts``, export).
"""
from .symbol_json import MARK, TRUE_STRINGS as _TRUE, infer_dtypes, unique_name

__all__ = ['REDUCE_PREFIX', 'substitute', 'restore_graph', 'rule_of']

#: MARK value prefix of the rewritten reduction (its original input: the helper Reshape's name
#: follows); helpers are marked :data:`_HELPER`.
REDUCE_PREFIX = 'reduce:'
_HELPER = 'reduce_helper'
_LAST = ('-1', '(-1,)', '[-1]', '(-1)')
_FIRST = ('0', '(0,)', '[0]', '(0)')


def _form(node):
    """``'last'``, ``'rows'`` or None: whether and how the rule rewrites ``node``."""
    if node['op'] not in ('sum', 'mean') or len(node['inputs']) != 1:
        return None
    attrs = node.get('attrs', {})
    if attrs.get(MARK) is not None:
        return None
    axis = attrs.get('axis', 'None').replace(' ', '')
    exclude = attrs.get('exclude', 'False') in _TRUE
    keepdims = attrs.get('keepdims', 'False') in _TRUE
    if axis in _LAST and not exclude:
        return 'last'
    if axis in _FIRST and exclude and not keepdims:
        return 'rows'
    return None


def substitute(js, policy, input_dtypes):
    """``js`` (graph JSON) with the rule applied (module docstring) to reductions of float32
    data (``input_dtypes``: ``{input name: dtype}`` as :func:`infer_dtypes` takes them, low
    precision read as float32): a new dict, or ``js`` itself where nothing applies or the
    policy turns it off. Integer and float64 reductions keep MXNet's kernel, and so do ops the
    user named in ``lp_ops`` or ``follow_ops``."""
    if policy.reductions == 'mxnet' or policy.target_dtype != 'bfloat16':
        return js
    nodes = js['nodes']
    mine = policy.lp_ops | policy.follow_ops   # the user's class wins over the rule
    chosen = {nid: _form(n) for nid, n in enumerate(nodes) if _form(n) and n['op'] not in mine}
    if not chosen:
        return js
    dtypes = infer_dtypes(js, input_dtypes)
    chosen = {nid: form for nid, form in chosen.items()
              if dtypes.get(tuple(nodes[nid]['inputs'][0][:2])) == 'float32'}
    if not chosen:
        return js
    names = {n['name'] for n in nodes}
    out, new_id = [], {}

    def add(op, name, inputs, **attrs):
        attrs[MARK] = _HELPER
        out.append({'op': op, 'name': unique_name(name, names), 'inputs': inputs,
                    'attrs': {k: str(v) for k, v in attrs.items()}})
        return [len(out) - 1, 0, 0]

    for nid, node in enumerate(nodes):
        inputs = [[new_id[s], i, v] for s, i, v in node['inputs']]
        form = chosen.get(nid)
        if form:
            base = node['name']
            x = inputs[0]
            if form == 'rows':   # (B, ...) -> (B, 1, ...): the last axis is reduced first
                x = add('expand_dims', base + '_mxmp_rows', [x], axis=1)
            rows = add('Reshape', base + '_mxmp_flat', [x], shape='(-1, 0)', reverse='True')
            reshape_name = out[-1]['name'] if form == 'last' else out[-2]['name']
            first = add('slice_axis', base + '_mxmp_row0', [rows], axis=0, begin=0, end=1)
            ones = add('ones_like', base + '_mxmp_ones', [first])
            # x's shape with the last axis 1 (any ndim); the original node reduces the rest
            y = add('FullyConnected', base + '_mxmp_gemv', [x, ones], num_hidden=1,
                    no_bias='True', flatten='False')
            if node['op'] == 'mean':
                count = add('sum', base + '_mxmp_count', [ones])
                y = add('broadcast_div', base + '_mxmp_mean', [y, count])
            attrs = dict(node.get('attrs', {}), **{MARK: REDUCE_PREFIX + reshape_name})
            node = dict(node, attrs=attrs)
            inputs = [y]
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
    return dict(js, nodes=out, heads=[[new_id[s], i, v] for s, i, v in js['heads']])


def restore_graph(js):
    """``js`` without the rule's nodes: each rewritten reduction reads its original input
    again and the helpers are gone. A new dict, or ``js`` where the rule wrote nothing."""
    nodes = js['nodes']
    if not any(_mark(n) == _HELPER for n in nodes):
        return js
    by_name = {n['name']: nid for nid, n in enumerate(nodes)}
    out, new_id = [], {}
    for nid, node in enumerate(nodes):
        mark = _mark(node)
        if mark == _HELPER:
            continue
        if mark.startswith(REDUCE_PREFIX):
            source = nodes[by_name[mark[len(REDUCE_PREFIX):]]]['inputs'][0]
            attrs = {k: v for k, v in node['attrs'].items() if k != MARK}
            node = dict(node, attrs=attrs, inputs=[source])
        out.append(dict(node, inputs=[[new_id[s], i, v] for s, i, v in node['inputs']]))
        new_id[nid] = len(out) - 1
    return dict(js, nodes=out, heads=[[new_id[s], i, v] for s, i, v in js['heads']])


def _mark(node):
    return node.get('attrs', {}).get(MARK, '') if node['op'] != 'null' else ''


def rule_of(node):
    """The explain rule (str) of a node the rule wrote, or None."""
    mark = _mark(node)
    if mark == _HELPER:
        return ("reduction rule: part of a float32 sum as FullyConnected with ones "
                "(MXNet's CPU reduction is slow; Policy(reductions='mxnet') keeps it)")
    if mark.startswith(REDUCE_PREFIX):
        return ("reduction rule: float32, reduces the FullyConnected-with-ones result "
                "(Policy(reductions='mxnet') keeps MXNet's reduction)")
    return None
