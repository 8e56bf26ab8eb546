"""The plan of the graph pass: the dtype each node computes in, and why.

Walk the nodes in topological order; :meth:`mxmp._src.policy.policy.Policy.classify` gives each op a class,
and the dtypes of its inputs (already decided) give the dtype it computes in: low-precision ops
run in the target dtype, float32 ops in float32, widest-type and follow ops in the widest dtype
among their float inputs. Integer tensors (indices, shapes) are never touched: which tensors are
floating point comes from MXNet's own type inference (:mod:`mxmp._src.graph.infer`) on the original
graph. :func:`prepare` turns the arguments of :func:`mxmp.convert_symbol`/:func:`mxmp.explain`
into the float32 graph JSON and the input dtypes the plan starts from; :func:`plan` makes one
:class:`Decision` per node.

Storage rules (``cast_params=True``): a parameter (a variable not in ``data_names``, float32 in
the graph) is stored in the target dtype when every consumer takes it in that dtype: a
low-precision op, or a cast the model wrote, ``amp_cast`` to the target dtype (storing it there
changes no value: the cast rounds the same way). With ``policy.follow_params``
(:mod:`mxmp.amp`, contrib.amp's meaning) an ``amp_multicast`` the model wrote whose inputs are
all variables takes it too, as ``mxnet.contrib.amp.convert_symbol(cast_optional_params=True)``
does (MXNet 1.9.1's tests ``test_bf16_casting``/``test_fp16_casting`` pin it): its float32
parameters are then stored in the target dtype, and the multicast computes in it. A parameter
with one other consumer (an ``amp_cast`` to float32, a float32 op) stays float32.

The other way round, whatever ``cast_params`` says: a parameter declared in low precision
(``__dtype__``: ``net.cast('bfloat16')``, contrib.amp's ``cast_optional_params``) that a consumer
takes in float32 at an input MXNet needs as a graph variable (``_MXNET_VARIABLE_INPUTS``:
Deconvolution's weight and bias; inputs MXNet writes in place, BatchNorm's moving statistics)
is stored in float32 (:func:`_float32_storage`; its arrays must be cast to float32:
:func:`mxmp._src.graph.symbol_json.float32_param_names`).
"""
import collections

from ..dtypes import (LOW_PRECISION_DTYPES as _LOW, dtype_name, from_mshadow_enum,
    normalize_dtype)
from ..policy.policy import FLOAT32, LOSS_OUTPUT, LOW_PRECISION, Policy
from .infer import infer_dtypes, mutable_inputs, node_output_dtypes
from .strip import previous_conversion, strip
from .symbol_json import CAST_OPS, MARK, cast_origin, load

__all__ = ['Decision', 'plan', 'prepare']

_RANK = {'float16': 1, 'bfloat16': 1, 'float32': 2, 'float64': 3}

#: Pseudo op class of the amp_cast/amp_multicast nodes that the model's own code wrote.
_MODEL_CAST = 'model_cast'

#: Outputs that MXNet itself types float32 whatever the data dtype (MXNet 1.9.1 facts, not
#: policy): BatchNorm(output_mean_var=True)'s mean and var outputs get the parameter dtype,
#: float32 (BatchNormType, src/operator/nn/batch_norm.cc). Found by tests/test_graph_fuzz.py.
_MXNET_FLOAT32_OUTPUTS = {'BatchNorm': (1, 2)}

#: Inputs that MXNet 1.9.1 needs as graph variables when the op computes in float32 (facts, not
#: policy): a float32 Deconvolution whose weight or bias is computed by another node (the cast
#: of a bfloat16 weight) crashes in training, SIGSEGV, "could not execute a primitive" or
#: "Check failed: ctx.dev_mask() == ..." (``mxmp check-kernels``, case lp-params, and the
#: float32 reproduction in mxmp/policy/ops_bfloat16.py). Inputs MXNet writes in place (BatchNorm's
#: moving statistics) are such inputs for every op (:func:`mxmp._src.graph.infer.mutable_inputs`).
_MXNET_VARIABLE_INPUTS = {'Deconvolution': (1, 2)}


def _is_float(d):
    return d in _RANK


#: One node's decision: its op class (or ``'variable'``), the rule that chose it, the dtype it
#: computes in (None: no float work), its output dtypes and the dtype it wants of each input.
Decision = collections.namedtuple('Decision', [
    'op_class',      # class constant, or 'variable'
    'rule',          # human-readable reason
    'dtype',         # dtype the node computes in (None: no float work)
    'outputs',       # list of output dtypes (None for non-float outputs)
    'wants',         # list of wanted input dtypes, None = leave as is
])


def _pinned_low(js):
    """{variable name: dtype} of variables whose ``__dtype__`` is a low-precision dtype that
    mxmp did not set (contrib.amp's ``cast_optional_params=True``, or the user's own)."""
    pinned = {n['name']: from_mshadow_enum(n.get('attrs', {}).get('__dtype__'))
              for n in js['nodes'] if n['op'] == 'null'}
    return {name: d for name, d in pinned.items() if d in _LOW}


def _consumers(nodes):
    users = collections.defaultdict(list)  # nid -> [(consumer nid, input position)]
    for nid, node in enumerate(nodes):
        for pos, (src, _, _) in enumerate(node['inputs']):
            users[src].append((nid, pos))
    return users


def plan(js, policy, input_dtypes, cast_params, data_names, pinned=()):
    """Decide each node's dtype. Returns (decisions, lp parameter names).

    ``pinned``: variables stored in low precision by their ``__dtype__`` (their dtype is in
    ``input_dtypes``). With ``policy.follow_params`` a second round stores in the target dtype
    the parameters that the first round cast down for follow ops (contrib.amp's rule).
    """
    decisions, lp_params = _plan_once(js, policy, input_dtypes, cast_params, data_names, pinned)
    if not policy.follow_params:
        return decisions, lp_params
    users = _consumers(js['nodes'])
    adapt = {js['nodes'][nid]['name'] for nid, node in enumerate(js['nodes'])
             if node['op'] == 'null' and node['name'] not in data_names and users[nid] and
             all(decisions[c].op_class not in (LOW_PRECISION, FLOAT32, LOSS_OUTPUT) and
                 decisions[c].wants[pos] == policy.target_dtype for c, pos in users[nid])}
    if not adapt:
        return decisions, lp_params
    return _plan_once(js, policy, input_dtypes, cast_params, data_names, pinned, adapt)


def _plan_once(js, policy, input_dtypes, cast_params, data_names, pinned=(),
               stored_lp=frozenset()):
    nodes = js['nodes']
    lp = policy.target_dtype
    # The input graph is float32: type it with float32 where the data comes in low precision,
    # and without the low-precision __dtype__ of variables stored in low precision.
    untyped = [dict(n, attrs={k: v for k, v in n['attrs'].items() if k != '__dtype__'})
               if n['op'] == 'null' and input_dtypes.get(n['name']) in _LOW and 'attrs' in n
               else n for n in nodes]
    orig = infer_dtypes(dict(js, nodes=untyped), {n: 'float32' if d in _LOW else d
                                                  for n, d in input_dtypes.items()})
    classes = [None] * len(nodes)
    for nid, node in enumerate(nodes):
        if node['op'] in CAST_OPS and cast_origin(node) == 'model':  # others were stripped
            classes[nid] = (_MODEL_CAST, 'cast written by the model: kept, computes as in MXNet')
        elif node['op'] != 'null':
            classes[nid] = policy.classify(node['op'], node.get('attrs', {}), node['name'])

    def wants_low(nid, pos):
        node = nodes[nid]
        op = node['op']
        return (classes[nid][0] == LOW_PRECISION and pos not in policy.index_inputs(op)
                and pos not in policy.float32_inputs(op))

    def cast_takes_low(nid):
        """A model's cast that takes its variable inputs in the target dtype (module
        docstring of :mod:`mxmp._src.graph.plan`, "storage rules")."""
        node = nodes[nid]
        if classes[nid][0] != _MODEL_CAST:
            return False
        if node['op'] == 'amp_cast':
            return node.get('attrs', {}).get('dtype') == lp
        return (node['op'] == 'amp_multicast' and policy.follow_params and
                all(nodes[src]['op'] == 'null' for src, _, _ in node['inputs']))

    float32_params = _float32_storage(nodes, classes, policy, pinned, data_names)
    lp_params = set(stored_lp)
    via_cast = set()
    if cast_params:
        users = _consumers(nodes)
        for nid, node in enumerate(nodes):
            if (node['op'] == 'null' and node['name'] not in data_names
                    and node['name'] not in input_dtypes and orig[(nid, 0)] == 'float32'
                    and users[nid]
                    and all(wants_low(c, pos) or cast_takes_low(c) for c, pos in users[nid])):
                lp_params.add(node['name'])
                if not all(wants_low(c, pos) for c, pos in users[nid]):
                    via_cast.add(node['name'])

    decisions, dtypes = [], {}
    for nid, node in enumerate(nodes):
        if node['op'] == 'null':
            d = input_dtypes.get(node['name'], orig[(nid, 0)])
            if node['name'] in float32_params:
                op_name, where, pos = float32_params[node['name']]
                d = 'float32'
                dec = Decision('variable', 'parameter stored in float32 (its __dtype__ says %s, '
                                'but %s %s takes it in float32 at input %d, which MXNet needs '
                                'as a graph variable)' % (input_dtypes[node['name']], op_name,
                                                          where, pos), d, [d], [])
            elif node['name'] in stored_lp:
                # The rule starts as cast_params' does: the builder stores both the same way.
                dec = Decision('variable', 'parameter stored in %s (cast_params by '
                                'follow_params: its consumers follow %s data)' % (lp, lp),
                                lp, [lp], [])
            elif node['name'] in via_cast:
                dec = Decision('variable', 'parameter stored in %s (cast_params: every '
                                'consumer takes it in %s: a low-precision op, the model\'s '
                                'amp_cast to %s%s)' % (lp, lp, lp, ', an amp_multicast of '
                                                       'variables' if policy.follow_params
                                                       else ''), lp, [lp], [])
            elif node['name'] in lp_params:
                dec = Decision('variable', 'parameter stored in %s (cast_params: every '
                                'consumer is a low-precision op)' % lp, lp, [lp], [])
            else:
                kind = 'data input' if node['name'] in data_names else 'parameter'
                if node['name'] in pinned:
                    kind = 'parameter stored in %s (its __dtype__ attribute)' % d
                dec = Decision('variable', kind, d, [d], [])
            decisions.append(dec)
            dtypes[(nid, 0)] = dec.outputs[0]
            continue
        op = node['op']
        op_class, rule = classes[nid]
        in_dtypes = [dtypes[(src, idx)] for src, idx, _ in node['inputs']]
        skip = set(policy.index_inputs(op)) | set(policy.float32_inputs(op))
        data_pos = [p for p, d in enumerate(in_dtypes) if _is_float(d) and p not in skip]
        if op_class == _MODEL_CAST:
            # The model's amp_cast/amp_multicast: inputs as they come, outputs as MXNet types
            # them (amp_multicast: all float inputs to the widest, or with cast_narrow=True the
            # narrowest, dtype; amp_cast: float inputs to its dtype).
            n_out = 0
            while (nid, n_out) in orig:
                n_out += 1
            outputs = (node_output_dtypes(node, in_dtypes, n_out) if None not in in_dtypes
                       else [orig[(nid, k)] for k in range(n_out)])
            for k, d in enumerate(outputs):
                dtypes[(nid, k)] = d
            low = [d for d in outputs if d in _LOW]
            decisions.append(Decision(op_class, rule, low[0] if low else (
                'float32' if any(_is_float(d) for d in outputs) else None), outputs,
                [None] * len(in_dtypes)))
            continue
        if op_class == LOW_PRECISION:
            # No float data input (e.g. transpose of int32 indices with lp_ops=['transpose']):
            # nothing computes in low precision; explain used to report the target dtype for
            # such a node (found by tests/test_graph_fuzz.py).
            compute = lp if data_pos else None
            wants = [lp if p in data_pos else None for p in range(len(in_dtypes))]
        elif op_class in (FLOAT32, LOSS_OUTPUT):
            compute = 'float32'
            wants = ['float32' if d in _LOW and p not in policy.index_inputs(op) else None
                     for p, d in enumerate(in_dtypes)]
        else:  # WIDEST_TYPE, FOLLOW
            floats = [in_dtypes[p] for p in data_pos]
            if policy.follow_params:  # parameters take the dtype of the other inputs
                own = [in_dtypes[p] for p in data_pos
                       if nodes[node['inputs'][p][0]]['op'] != 'null'
                       or nodes[node['inputs'][p][0]]['name'] in data_names]
                floats = own or floats
            if not floats:
                compute = None
            elif len(set(floats)) == 1:
                compute = floats[0]
            else:
                top = max(_RANK[d] for d in floats)
                compute = 'float32' if top == 1 else \
                    [d for d in floats if _RANK[d] == top][0]
            if compute is not None and len(set(floats)) > 1:
                rule += ' (inputs mixed: widest is %s)' % compute
            wants = [compute if p in data_pos else None for p in range(len(in_dtypes))]
        for p in policy.float32_inputs(op):
            if p < len(in_dtypes) and in_dtypes[p] in _LOW:
                wants[p] = 'float32'
        outputs = []
        k = 0
        while (nid, k) in orig:
            d = orig[(nid, k)]
            if _is_float(d) and compute in _LOW and k not in _MXNET_FLOAT32_OUTPUTS.get(op, ()):
                d = compute
            outputs.append(d)
            dtypes[(nid, k)] = d
            k += 1
        decisions.append(Decision(op_class, rule, compute if compute in _LOW else
                                   ('float32' if any(_is_float(o) for o in outputs) else None),
                                   outputs, wants))
    return decisions, lp_params


def _float32_storage(nodes, classes, policy, pinned, data_names):
    """{variable name: (op, node name, input position)} of the variables stored in low
    precision (``pinned``, by their ``__dtype__``: ``net.cast('bfloat16')``, contrib.amp's
    ``cast_optional_params``) that must be stored in float32 instead: a consumer takes them
    in float32 at an input that MXNet needs as a graph variable (``_MXNET_VARIABLE_INPUTS``,
    mutable inputs). Casting them there would give that input the cast's output: a crash in
    MXNet (Deconvolution), or moving statistics that are never updated (BatchNorm). Storing
    them in float32 changes no value (a float32 array holds every low-precision value); the
    other consumers get the usual cast. Data inputs are never re-stored."""
    out = {}
    for nid, node in enumerate(nodes):
        if node['op'] == 'null' or classes[nid] is None:
            continue
        op = node['op']
        float32_op = classes[nid][0] in (FLOAT32, LOSS_OUTPUT)
        needs_var = set(_MXNET_VARIABLE_INPUTS.get(op, ())) if float32_op else set()
        if any(nodes[src]['op'] == 'null' and nodes[src]['name'] in pinned
               for src, _, _ in node['inputs']):
            needs_var |= set(mutable_inputs(node))
        for pos, (src, _, _) in enumerate(node['inputs']):
            name = nodes[src]['name']
            if (pos in needs_var and nodes[src]['op'] == 'null' and name in pinned and
                    name not in data_names and name not in out and
                    (float32_op or pos in policy.float32_inputs(op))):
                out[name] = (op, node['name'], pos)
    return out


def _make_policy(target_dtype, policy, emulate):
    if policy is None:
        policy = Policy('bfloat16' if target_dtype is None else target_dtype)
    elif not isinstance(policy, Policy):
        raise TypeError('policy must be an mxmp.Policy, got %s' % type(policy).__name__)
    elif target_dtype is not None and normalize_dtype(target_dtype) != policy.target_dtype:
        raise ValueError('target_dtype=%r disagrees with policy.target_dtype=%r; pass one'
                         % (target_dtype, policy.target_dtype))
    if emulate is not None and bool(emulate) != policy.emulate:
        policy = policy.replace(emulate=emulate)
    return policy


def prepare(sym, target_dtype, policy, emulate, data_dtypes, data_names):
    """The graph and inputs the plan starts from (arguments as :func:`mxmp.convert_symbol`).

    Returns:
        tuple ``(js, policy, input_dtypes, data_names, pinned)``: the graph JSON without its
        mixed-precision casts, the :class:`mxmp.Policy` to apply, ``{input name: dtype}`` (data
        inputs and variables stored in low precision by their ``__dtype__``), the set of data
        input names and the set of those pinned variables.

    Raises:
        TypeError: ``sym`` is not a Symbol, or ``policy`` not a Policy.
        ValueError: a graph converted to the other target dtype; variables stored in the other
            low-precision dtype; ``target_dtype`` disagreeing with ``policy``.
    """
    js = load(sym)
    policy = _make_policy(target_dtype, policy, emulate)
    previous = previous_conversion(js)
    if previous is not None and previous != policy.target_dtype:
        raise ValueError(
            'the graph was already converted to %s; converting it to %s needs the float32 '
            'graph: mxmp.convert_symbol(mxmp.remove_casts(sym), %r)'
            % (previous, policy.target_dtype, policy.target_dtype))
    # Strip mxmp's casts whenever there are any, not only when one casts to a low-precision
    # dtype: a graph whose data comes in the target dtype (data_dtypes) can hold nothing but
    # casts to float32, e.g. relu(data) -> [relu_amp_cast_float32]. Those casts used to be kept
    # and classified as float32 ops, so converting again added a second cast
    # relu_amp_cast_float321 (found by tests/test_graph_fuzz.py).
    # contrib.amp's casts go too (cast_origin): the float32/low-precision decisions are
    # mxmp's, made again on the float32 graph; the model's own casts stay.
    if previous is not None or any(node.get('attrs', {}).get(MARK) is not None or
                                   cast_origin(node) == 'contrib.amp' for node in js['nodes']):
        js = strip(js)  # same target: converting again gives the same graph
    input_dtypes = {}
    for name, d in (data_dtypes or {}).items():
        input_dtypes[name] = dtype_name(d) if not isinstance(d, str) else d
    names = set(data_names if data_names is not None else ('data',)) | set(input_dtypes)
    pinned = {n: d for n, d in _pinned_low(js).items() if n not in input_dtypes}
    wrong = sorted(n for n, d in pinned.items() if d != policy.target_dtype)
    if wrong:
        raise ValueError(
            'variable(s) %s are stored in %s (their __dtype__ attribute, e.g. from '
            "mxnet.contrib.amp's cast_optional_params=True); converting to %s needs them in "
            'float32: delete their __dtype__ attribute and cast their arrays to float32'
            % (', '.join(wrong[:5]), pinned[wrong[0]], policy.target_dtype))
    input_dtypes.update(pinned)
    return js, policy, input_dtypes, names, set(pinned)

