"""The plan of the graph pass: the dtype each node computes in and why (:func:`plan`), and
:func:`explain`, which shows it.

Nodes are walked in topological order and identified by position, never by name. Each op gets a
class from :meth:`Policy.classify`; low-precision ops run in the target dtype, float32 ops in
float32, widest-type and follow ops in the widest dtype of their float inputs. Which tensors
are floating point comes from MXNet's type inference on the float32 graph. Storage rules of
variables: docs/pass.md.
"""
import collections
from typing import List, NamedTuple, Optional

from ..dtypes import LOW_PRECISION_DTYPES as _LOW, dtype_name, from_mshadow_enum
from ..policy.policy import FLOAT32, FOLLOW, LOSS_OUTPUT, LOW_PRECISION, resolve_policy
from .kernel_rule import FLOAT32_INPUTS as _KERNEL_FLOAT32_INPUTS, FLOAT32_OUTPUTS as \
    _KERNEL_FLOAT32_OUTPUTS, INPUT_COPY as _INPUT_COPY, original_op, planned, substitute
from .strip import converted_dtype, strip
from .symbol_json import (CAST_OPS, MARK, cast_origin, infer_dtypes, load, mutable_inputs,
    node_output_dtypes)

__all__ = ['Decision', 'plan', 'prepare', 'ExplainRow', 'explain', 'format_explain']

_RANK = {'float16': 1, 'bfloat16': 1, 'float32': 2, 'float64': 3}

#: Pseudo op class of the amp_cast/amp_multicast nodes that the model's own code wrote.
_MODEL_CAST = 'model_cast'

#: Outputs MXNet 1.9.1 types float32 whatever the data dtype: BatchNorm(output_mean_var=True)'s
#: mean and var (BatchNormType, src/operator/nn/batch_norm.cc).
_MXNET_FLOAT32_OUTPUTS = {'BatchNorm': (1, 2)}

#: Inputs MXNet 1.9.1 needs as graph variables when the op computes in float32: a float32
#: Deconvolution whose weight or bias is a cast's output crashes in training (docs/pass.md).
_MXNET_VARIABLE_INPUTS = {'Deconvolution': (1, 2)}


def _is_float(d):
    return d in _RANK


class Decision(NamedTuple):
    """One node's decision (what the rewrite needs; ``rule`` is for :func:`explain` only)."""
    op_class: str            # class constant, 'variable' or 'model_cast'
    rule: str                # human-readable reason
    dtype: Optional[str]     # dtype the node computes in (None: no float work)
    outputs: List            # output dtypes (None for non-float outputs)
    wants: List              # wanted dtype of each input (None: as it comes)
    stored_dtype: Optional[str] = None   # a variable's storage the pass chose (None: declared)


def _variable(kind, dtype, stored=None):
    return Decision('variable', kind, dtype, [dtype], [], stored)


class _Graph:
    """What every step of one plan reads: the nodes, the policy, the inputs and their classes."""

    def __init__(self, js, policy, input_dtypes, data_names, pinned, kernel_nodes=None):
        self.nodes = js['nodes']
        self.policy = policy
        self.lp = policy.target_dtype
        self.input_dtypes = input_dtypes
        self.data_names = data_names
        self.pinned = pinned
        self.users = collections.defaultdict(list)  # nid -> [(consumer nid, input position)]
        self.heads = {nid for nid, _, _ in js['heads']}
        for nid, node in enumerate(self.nodes):
            for pos, (src, _, _) in enumerate(node['inputs']):
                self.users[src].append((nid, pos))
        # The input graph typed as float32: low-precision data and variables typed float32.
        untyped = [dict(n, attrs={k: v for k, v in n['attrs'].items() if k != '__dtype__'})
                   if n['op'] == 'null' and input_dtypes.get(n['name']) in _LOW and 'attrs' in n
                   else n for n in self.nodes]
        self.orig = infer_dtypes(dict(js, nodes=untyped), {n: 'float32' if d in _LOW else d
                                                           for n, d in input_dtypes.items()})
        from .rule_notes import rewritten_class, rules_left   # not loaded by `import mxmp`
        self.classes = [None] * len(self.nodes)
        # Nodes the kernel rule runs as library ops (written, or planned for explain): their
        # data input (0) alone decides a follow op's dtype (not LayerNorm's parameters or
        # Dropout's flag).
        self.library = {nid for nid, node in enumerate(self.nodes) if node['op'] != 'null' and
                        (original_op(node) is not None or node['name'] in (kernel_nodes or {}))}
        for nid, node in enumerate(self.nodes):
            rewritten = rewritten_class(policy, node, kernel_nodes or {})
            if node['op'] in CAST_OPS and cast_origin(node) == 'model':  # others were stripped
                self.classes[nid] = (_MODEL_CAST,
                                     'cast written by the model: kept, computes as in MXNet')
            elif rewritten is not None:   # the kernel and reduction rules' nodes: float32
                self.classes[nid] = rewritten
            elif node['op'] != 'null':
                self.classes[nid] = rules_left(policy, node, policy.classify(
                    node['op'], node.get('attrs', {}), node['name']))

    def n_outputs(self, nid):
        k = 0
        while (nid, k) in self.orig:
            k += 1
        return k

    def wants_low(self, nid, pos):
        op = self.nodes[nid]['op']
        return (self.classes[nid][0] == LOW_PRECISION and pos not in self.policy.index_inputs(op)
                and pos not in self.policy.float32_inputs(op))

    def cast_takes_low(self, nid):
        """A model's cast that takes its variable inputs in the target dtype: an ``amp_cast``
        to it, or (``follow_params``) an ``amp_multicast`` of variables only."""
        node = self.nodes[nid]
        if self.classes[nid][0] != _MODEL_CAST:
            return False
        if node['op'] == 'amp_cast':
            return node.get('attrs', {}).get('dtype') == self.lp
        return (node['op'] == 'amp_multicast' and self.policy.follow_params and
                all(self.nodes[src]['op'] == 'null' for src, _, _ in node['inputs']))


def plan(js, policy, input_dtypes, data_names, pinned=(), kernel_nodes=None):
    """One :class:`Decision` per node of ``js`` (list, in node order).

    ``pinned``: variables stored in low precision by their ``__dtype__``. With
    ``policy.follow_params`` a second round stores in the target dtype the parameters that the
    first round cast down for follow ops (contrib.amp's rule). ``kernel_nodes``: explain's.
    """
    graph = _Graph(js, policy, input_dtypes, data_names, pinned, kernel_nodes)
    decisions = _plan_once(graph)
    if not policy.follow_params:
        return decisions
    adapt = {node['name'] for nid, node in enumerate(graph.nodes)
             if node['op'] == 'null' and node['name'] not in data_names and graph.users[nid] and
             all(decisions[c].op_class not in (LOW_PRECISION, FLOAT32, LOSS_OUTPUT) and
                 decisions[c].wants[pos] == policy.target_dtype for c, pos in graph.users[nid])}
    return _plan_once(graph, adapt) if adapt else decisions


def _plan_once(graph, stored_lp=frozenset()):
    storage = _storage(graph, stored_lp)
    decisions, dtypes = [], {}
    for nid, node in enumerate(graph.nodes):
        if node['op'] == 'null':
            dec = _variable_decision(graph, nid, storage)
        else:
            in_dtypes = [dtypes[(src, idx)] for src, idx, _ in node['inputs']]
            if graph.classes[nid][0] == _MODEL_CAST:
                dec = _model_cast_decision(graph, nid, in_dtypes)
            else:
                dec = _op_decision(graph, nid, in_dtypes)
        decisions.append(dec)
        for k, d in enumerate(dec.outputs):
            dtypes[(nid, k)] = d
    return decisions


def _storage(graph, stored_lp):
    """{variable name: Decision} of the variables whose storage the pass chooses."""
    lp, policy = graph.lp, graph.policy
    out = _float32_storage(graph)
    for name in set(stored_lp) - set(out):
        out[name] = _variable('parameter stored in %s (cast_params by follow_params: its '
                              'consumers follow %s data)' % (lp, lp), lp, lp)
    if not policy.cast_params:
        return out
    for nid, node in enumerate(graph.nodes):
        users = graph.users[nid]
        name = node['name']
        if (node['op'] != 'null' or name in graph.data_names or name in graph.input_dtypes
                or graph.orig[(nid, 0)] != 'float32' or not users or name in out
                or not all(graph.wants_low(c, p) or graph.cast_takes_low(c) for c, p in users)):
            continue
        why = ('is a low-precision op' if all(graph.wants_low(c, p) for c, p in users) else
               "takes it in %s: a low-precision op, the model's amp_cast to %s%s"
               % (lp, lp, ', an amp_multicast of variables' if policy.follow_params else ''))
        out[name] = _variable('parameter stored in %s (cast_params: every consumer %s)'
                              % (lp, why), lp, lp)
    from .moved_params import MOVE_OPS, moved_to_low   # not loaded by `import mxmp`
    for name in (moved_to_low(graph) if policy.cast_moved_params else ()):
        out.setdefault(name, _variable(
            'parameter stored in %s (cast_params, cast_moved_params: it reaches only low-'
            'precision ops, through %s of parameters alone: no float32 copy of the result)'
            % (lp, '/'.join(sorted(MOVE_OPS))), lp, lp))
    return out


def _variable_decision(graph, nid, storage):
    name = graph.nodes[nid]['name']
    if name in storage:
        return storage[name]
    d = graph.input_dtypes.get(name, graph.orig[(nid, 0)])
    kind = 'data input' if name in graph.data_names else 'parameter'
    if name in graph.pinned:
        kind = 'parameter stored in %s (its __dtype__ attribute)' % d
    return _variable(kind, d)


def _model_cast_decision(graph, nid, in_dtypes):
    """The model's amp_cast/amp_multicast: inputs as they come, outputs as MXNet types them."""
    node, n_out = graph.nodes[nid], graph.n_outputs(nid)
    outputs = (node_output_dtypes(node, in_dtypes, n_out) if None not in in_dtypes
               else [graph.orig[(nid, k)] for k in range(n_out)])
    low = [d for d in outputs if d in _LOW]
    dtype = low[0] if low else ('float32' if any(_is_float(d) for d in outputs) else None)
    return Decision(_MODEL_CAST, graph.classes[nid][1], dtype, outputs, [None] * len(in_dtypes))


def _op_decision(graph, nid, in_dtypes):
    node, policy = graph.nodes[nid], graph.policy
    op = node['op']
    op_class, rule = graph.classes[nid]
    skip = set(policy.index_inputs(op)) | set(policy.float32_inputs(op))
    data_pos = [p for p, d in enumerate(in_dtypes) if _is_float(d) and p not in skip]
    if op_class in (FLOAT32, LOSS_OUTPUT):
        compute = 'float32'
        wants = ['float32' if d in _LOW and p not in policy.index_inputs(op) else None
                 for p, d in enumerate(in_dtypes)]
    elif nid in graph.library and op_class == FOLLOW:   # a library op: its data's dtype
        compute = in_dtypes[0] if _is_float(in_dtypes[0]) else None
        wants = [None] * len(in_dtypes)
    else:
        if op_class == LOW_PRECISION:
            compute = graph.lp if data_pos else None   # no float data: nothing runs low
        else:  # WIDEST_TYPE, FOLLOW
            compute, rule = _widest(graph, node, in_dtypes, data_pos, rule)
        wants = [compute if p in data_pos else None for p in range(len(in_dtypes))]
    for p in tuple(policy.float32_inputs(op)) + (_KERNEL_FLOAT32_INPUTS.get(op, ())
                                                  if nid in graph.library else ()):
        if p < len(in_dtypes) and in_dtypes[p] in _LOW:
            wants[p] = 'float32'
    keep32 = _MXNET_FLOAT32_OUTPUTS.get(op, ()) + (_KERNEL_FLOAT32_OUTPUTS.get(op, ())
                                                   if nid in graph.library else ())
    outputs = []
    for k in range(graph.n_outputs(nid)):
        d = graph.orig[(nid, k)]
        if _is_float(d) and compute in _LOW and k not in keep32:
            d = compute
        outputs.append(d)
    dtype = compute if compute in _LOW else \
        ('float32' if any(_is_float(o) for o in outputs) else None)
    return Decision(op_class, rule, dtype, outputs, wants)


def _widest(graph, node, in_dtypes, data_pos, rule):
    """``(compute dtype, rule)`` of a widest-type or follow op."""
    floats = [in_dtypes[p] for p in data_pos]
    # follow_params: parameters take the dtype of the other inputs; not through the kernel
    # rule's input copies (a library LayerNorm's gamma and beta are float32 master
    # parameters: taking the shape tie's bfloat16 would store them in bfloat16)
    if graph.policy.follow_params and node.get('attrs', {}).get(MARK) != _INPUT_COPY:
        own = [in_dtypes[p] for p in data_pos
               if graph.nodes[node['inputs'][p][0]]['op'] != 'null'
               or graph.nodes[node['inputs'][p][0]]['name'] in graph.data_names]
        floats = own or floats
    if not floats:
        return None, rule
    if len(set(floats)) == 1:
        return floats[0], rule
    top = max(_RANK[d] for d in floats)
    compute = 'float32' if top == 1 else [d for d in floats if _RANK[d] == top][0]
    return compute, rule + ' (inputs mixed: widest is %s)' % compute


def _float32_storage(graph):
    """{variable name: Decision} of the low-precision variables (``pinned`` by ``__dtype__``,
    or declared by ``data_dtypes``) that a consumer takes in float32 at an input MXNet needs as
    a graph variable (``_MXNET_VARIABLE_INPUTS``, mutable inputs): they are declared float32
    instead, so that binding puts a float32 array there. A cast there would reach MXNet's
    abort (Deconvolution's training backward with a computed weight: "Check failed:
    ctx.dev_mask() == ...") or its refusal to bind (BatchNorm's moving statistics)."""
    nodes, out = graph.nodes, {}
    low = {n for n, d in graph.input_dtypes.items() if d in _LOW}
    declared = low - set(graph.pinned)   # by data_dtypes: a data input for the rest of the pass
    for nid, node in enumerate(nodes):
        if node['op'] == 'null':
            continue
        op = node['op']
        float32_op = graph.classes[nid][0] in (FLOAT32, LOSS_OUTPUT)
        needs_var = set(_MXNET_VARIABLE_INPUTS.get(op, ())) if float32_op else set()
        if any(nodes[src]['op'] == 'null' and nodes[src]['name'] in low
               for src, _, _ in node['inputs']):
            needs_var |= set(mutable_inputs(node))
        for pos, (src, _, _) in enumerate(node['inputs']):
            name = nodes[src]['name']
            if (pos in needs_var and nodes[src]['op'] == 'null' and name not in out and
                    (name in declared or name in graph.pinned and name not in graph.data_names)
                    and (float32_op or pos in graph.policy.float32_inputs(op))):
                why = ('%s says %s, but %s %s takes it in float32 at input %d, which MXNet '
                       'needs as a graph variable' % ('data_dtypes' if name in declared else
                                                      'its __dtype__', graph.input_dtypes[name],
                                                      op, node['name'], pos))
                out[name] = _variable(
                    'declared float32 (%s: bind a float32 array there)' % why
                    if name in declared else 'parameter stored in float32 (%s)' % why,
                    'float32', 'float32')
    return out


def prepare(sym, target_dtype, policy, emulate, data_dtypes, data_names, cast_params=None,
            kernels=True):
    """The graph, its inputs and its :func:`plan` (arguments as :func:`mxmp.convert_symbol`).
    ``kernels=False``: the kernel rule's nodes planned, not written (:func:`explain`).

    Returns:
        tuple ``(js, policy, input_dtypes, data_names, decisions)``: the graph JSON without its
        mixed-precision casts, the resolved :class:`mxmp.Policy` (``emulate`` a bool), ``{input
        name: dtype}``, the set of data input names and one :class:`Decision` per node.

    Raises:
        TypeError, ValueError: as :func:`mxmp.convert_symbol`.
    """
    js = load(sym)
    policy = resolve_policy(policy, target_dtype, cast_params, emulate)
    if policy.emulate == 'auto':   # no context here: the real graph
        policy = policy.replace(emulate=False)
    previous = converted_dtype(js)
    if previous is not None and previous != policy.target_dtype:
        raise ValueError(
            'the graph was already converted to %s; converting it to %s needs the float32 '
            'graph: mxmp.convert_symbol(mxmp.remove_casts(sym), %r)'
            % (previous, policy.target_dtype, policy.target_dtype))
    # Strip mxmp's and contrib.amp's casts: decided again on the float32 graph; model's stay.
    if previous is not None or any(node.get('attrs', {}).get(MARK) is not None or
                                   cast_origin(node) == 'contrib.amp' for node in js['nodes']):
        js = strip(js)
    kernel_nodes = None if kernels else planned(js, policy)
    js = substitute(js, policy) if kernels else js
    input_dtypes = {name: d if isinstance(d, str) else dtype_name(d)
                    for name, d in (data_dtypes or {}).items()}
    names = set(data_names if data_names is not None else ('data',)) | set(input_dtypes)
    pinned = {n['name']: from_mshadow_enum(n.get('attrs', {}).get('__dtype__'))
              for n in js['nodes'] if n['op'] == 'null' and n['name'] not in input_dtypes}
    pinned = {name: d for name, d in pinned.items() if d in _LOW}
    wrong = sorted(n for n, d in pinned.items() if d != policy.target_dtype)
    if wrong:
        raise ValueError(
            'variable(s) %s are stored in %s (their __dtype__ attribute, e.g. from '
            "mxnet.contrib.amp's cast_optional_params=True); converting to %s needs them in "
            'float32: delete their __dtype__ attribute and cast their arrays to float32'
            % (', '.join(wrong[:5]), pinned[wrong[0]], policy.target_dtype))
    input_dtypes.update(pinned)
    from . import reduce_rule, residual_rule   # loaded by the first use, not by `import mxmp`
    as_float32 = {n: 'float32' if d in _LOW else d for n, d in input_dtypes.items()}
    js = residual_rule.substitute(reduce_rule.substitute(js, policy, as_float32), policy,
                                  as_float32)
    decisions = plan(js, policy, input_dtypes, names, set(pinned), kernel_nodes)
    from .ln_copy import drop_cast_copies   # the LayerNorm copies the plan casts twice
    dropped = drop_cast_copies(js, decisions, policy.emulate)
    if dropped is not js:
        js, decisions = dropped, plan(dropped, policy, input_dtypes, names, set(pinned))
    return js, policy, input_dtypes, names, decisions


class ExplainRow(NamedTuple):
    """Node ``name`` of operator ``op`` computes in ``dtype`` (None: no float work) by ``rule``."""
    name: str
    op: str
    dtype: Optional[str]
    rule: str


def explain(sym, target_dtype=None, policy=None, data_dtypes=None, cast_params=None,
            data_names=None):
    """The pass's decision for every node of ``sym``, without rewriting it.

    A BatchNorm that fused inference folds into the low-precision Convolution before it
    (:mod:`mxmp._src.graph.fold`) has that rewrite added to its rule. Every rule that changed
    a node is named, after the user's choice where the user named its op; a library op of the
    kernel rule is decided from the graph alone (explain never builds or loads the library).

    Args: as :func:`mxmp.convert_symbol` (``sym`` float32 or converted; casts are ignored).

    Returns:
        list of :class:`ExplainRow` in topological order; variables have op ``'null'``.

    Raises:
        TypeError, ValueError: as :func:`mxmp.convert_symbol`.
    """
    from .fold import batchnorm_folds, fold_rule   # a rewrite of fused inference only
    js, policy, _, _, decisions = prepare(sym, target_dtype, policy, None, data_dtypes,
                                          data_names, cast_params, kernels=False)
    kernel_nodes = planned(js, policy)
    from .selfatt_pair import planned_pairs   # not loaded by `import mxmp`
    notes = planned_pairs(js, kernel_nodes)   # the kernel rule's self-attention pairs
    dtypes = {node['name']: dec.dtype for node, dec in zip(js['nodes'], decisions)}
    from .ln_copy import planned_copies   # and LayerNorm copies
    for name, note in planned_copies(js, kernel_nodes, dtypes).items():
        notes[name] = notes[name] + '; ' + note if name in notes else note
    folds = {bn: conv for bn, conv in batchnorm_folds(js).items() if dtypes.get(conv) in _LOW}
    return [ExplainRow(node['name'], kernel_nodes.get(node['name'], node['op']), dec.dtype,
                       dec.rule + ('; ' + fold_rule(folds[node['name']])
                                   if node['name'] in folds else '') +
                       ('; ' + notes[node['name']] if node['name'] in notes else ''))
            for node, dec in zip(js['nodes'], decisions)]


def format_explain(rows, include_variables=False):
    """:func:`explain` rows as lines ``FullyConnected fc1 -> float16: rule`` (str)."""
    return '\n'.join('%s %s -> %s: %s' % (row.op if row.op != 'null' else 'variable', row.name,
                                          row.dtype, row.rule)
                     for row in rows if row.op != 'null' or include_variables)

