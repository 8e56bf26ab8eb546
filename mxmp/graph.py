"""The mixed-precision graph pass over an MXNet Symbol.

:func:`convert_symbol` rewrites a float32 Symbol into a mixed-precision one:

1. *Plan*: walk the nodes in topological order; :meth:`mxmp.policy.Policy.classify` gives each
   op a class, and the dtypes of its inputs (already decided) give the dtype it computes in:
   low-precision ops run in the target dtype, float32 ops in float32, widest-type and follow
   ops in the widest dtype among their float inputs. Integer tensors (indices, shapes) are never
   touched: which tensors are floating point comes from MXNet's own type inference
   (``Symbol.infer_type_partial``) on the original graph.
2. *Rewrite*: an ``amp_cast`` node goes on every edge whose source dtype differs from what the
   consumer needs, and only there. Casts are shared: a tensor is cast at most once per dtype,
   whatever the number of its consumers. Graph outputs are cast back to float32.
3. *Check*: MXNet's type inference on the new graph must agree with the plan, node by node;
   a disagreement is an op-list bug and raises instead of producing a graph that fails later.

Every node's decision (op, dtype, the rule that chose it) is available from :func:`explain`.

``cast_params=True`` stores the parameters whose every consumer is a low-precision op in the
target dtype (no cast per iteration); the optimizer wrapper then keeps float32 master weights.

``emulate=True`` (float16 or bfloat16 numerics with float32 kernels, for CPUs without
low-precision kernels): the graph is the real low-precision graph, node for node, plus round
trips. Every low-precision tensor is held in float32 and rounded through the target dtype
(``amp_cast`` to the target dtype, then back to float32) where it is produced, so low-precision
ops see rounded inputs and produce rounded outputs, while their kernels accumulate in float32,
as NVIDIA Tensor Cores do (Micikevicius et al., "Mixed Precision Training", ICLR 2018).
Overflow to inf and flush to zero happen at the same tensors as on a GPU; gradients flow back
through the same casts and are rounded the same way. bfloat16 emulation rounds with five
elementwise nodes instead of the two casts (MXNet's bfloat16 cast is ~30x slower than an
elementwise op on AVX2 CPUs, see ``_Builder._round_bfloat16``): forward values are rounded
exactly as by the cast, gradients are not rounded.

Facts used here (MXNet 1.9.1): ``Symbol.tojson(remove_amp_cast=False)`` keeps cast nodes
(the default strips them); a variable's ``__dtype__`` attribute (the mshadow type enum,
``include/mshadow/base.h``: float16=2, bfloat16=12) fixes its dtype for type inference.
"""
import collections
import json
import logging

import numpy as np

from .casts import (_LOW, _MSHADOW_ENUM, MARK, ROUND_MARK, _dtype_name,  # noqa: F401
                    _dump, _load, _previous_conversion, _strip, converted_dtype, count_casts,
                    pin_variable_dtypes, remove_casts)
from .policy import FLOAT32, LOSS_OUTPUT, LOW_PRECISION, Policy, normalize_dtype

__all__ = ['convert_symbol', 'remove_casts', 'explain', 'format_explain', 'ExplainRow',
           'count_casts', 'converted_dtype']

logger = logging.getLogger(__name__)

_RANK = {'float16': 1, 'bfloat16': 1, 'float32': 2, 'float64': 3}

#: Outputs that MXNet itself types float32 whatever the data dtype (MXNet 1.9.1 facts, not
#: policy): BatchNorm(output_mean_var=True)'s mean and var outputs get the parameter dtype,
#: float32 (BatchNormType, src/operator/nn/batch_norm.cc). Found by tests/test_graph_fuzz.py.
_MXNET_FLOAT32_OUTPUTS = {'BatchNorm': (1, 2)}

ExplainRow = collections.namedtuple('ExplainRow', ['name', 'op', 'dtype', 'rule'])
ExplainRow.__doc__ = """One decision of the pass: node ``name`` of operator ``op`` computes in
``dtype`` (``None`` for a node without float outputs) because of ``rule``."""


def _is_float(d):
    return d in _RANK


# ---------------------------------------------------------------------------------------------
# Plan: one decision per node
# ---------------------------------------------------------------------------------------------
_Decision = collections.namedtuple('_Decision', [
    'op_class',      # class constant, or 'variable'
    'rule',          # human-readable reason
    'dtype',         # dtype the node computes in (None: no float work)
    'outputs',       # list of output dtypes (None for non-float outputs)
    'wants',         # list of wanted input dtypes, None = leave as is
])


def _infer_dtypes(js, input_dtypes):
    """(node name, out) -> dtype name of every visible output of a graph, from MXNet.

    Inputs without a dtype (given, or a ``__dtype__`` attribute) are taken as float32.
    """
    # A bfloat16 input must be typed through its variable's ``__dtype__`` attribute: MXNet
    # 1.9.1's Symbol.infer_type(_partial) silently drops bfloat16 keyword arguments (their numpy
    # type, np.void, is not in _DTYPE_NP_TO_MX), which left the input untyped and made
    # convert_symbol(..., 'bfloat16', data_dtypes={'data': 'bfloat16'}) raise (found by
    # tests/test_graph_fuzz.py). So bfloat16 and float16 inputs get the attribute on a copy.
    nodes = []
    for node in js['nodes']:
        d = input_dtypes.get(node['name'])
        if node['op'] == 'null' and d in _MSHADOW_ENUM and \
                '__dtype__' not in node.get('attrs', {}):
            node = dict(node, attrs=dict(node.get('attrs', {}), __dtype__=_MSHADOW_ENUM[d]))
        nodes.append(node)
    js = dict(js, nodes=nodes)
    sym = _dump(js)
    internals = sym.get_internals()
    args = {}
    for node in js['nodes']:
        if node['op'] != 'null' or '__dtype__' in node.get('attrs', {}):
            continue
        args[node['name']] = np.dtype(input_dtypes.get(node['name'], 'float32'))
    try:
        _, out_types, _ = internals.infer_type_partial(**args)
    except Exception as err:  # MXNetError: inconsistent dtypes
        raise ValueError('MXNet cannot infer the dtypes of the graph: %s' % err) from err
    result, previous, k = {}, None, 0
    for p, dtype in enumerate(out_types):
        owner = internals[p].name
        k = k + 1 if owner == previous else 0
        previous = owner
        result[(owner, k)] = _dtype_name(dtype)
    return result


def _original_dtypes(js, input_dtypes):
    """(nid, out) -> dtype name of every visible output of the input graph."""
    by_name = _infer_dtypes(js, input_dtypes)
    names = [n['name'] for n in js['nodes']]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError('node names must be unique for the pass; repeated: %s'
                         % ', '.join(dup[:5]))
    nid_of = {name: nid for nid, name in enumerate(names)}
    return {(nid_of[name], k): d for (name, k), d in by_name.items() if name in nid_of}


def _consumers(nodes):
    users = collections.defaultdict(list)  # nid -> [(consumer nid, input position)]
    for nid, node in enumerate(nodes):
        for pos, (src, _, _) in enumerate(node['inputs']):
            users[src].append((nid, pos))
    return users


def _plan(js, policy, input_dtypes, cast_params, data_names):
    """Decide each node's dtype. Returns (decisions, lp parameter names).

    With ``policy.follow_params`` a second round stores in the target dtype the parameters
    that the first round cast down for follow ops (contrib.amp's rule).
    """
    decisions, lp_params = _plan_once(js, policy, input_dtypes, cast_params, data_names)
    if not policy.follow_params:
        return decisions, lp_params
    users = _consumers(js['nodes'])
    adapt = {js['nodes'][nid]['name'] for nid, node in enumerate(js['nodes'])
             if node['op'] == 'null' and node['name'] not in data_names and users[nid] and
             all(decisions[c].op_class not in (LOW_PRECISION, FLOAT32, LOSS_OUTPUT) and
                 decisions[c].wants[pos] == policy.target_dtype for c, pos in users[nid])}
    if not adapt:
        return decisions, lp_params
    return _plan_once(js, policy, input_dtypes, cast_params, data_names, adapt)


def _plan_once(js, policy, input_dtypes, cast_params, data_names, stored_lp=frozenset()):
    nodes = js['nodes']
    lp = policy.target_dtype
    # The input graph is float32: type it with float32 where the data comes in low precision.
    orig = _original_dtypes(js, {n: 'float32' if d in _LOW else d
                                 for n, d in input_dtypes.items()})
    classes = [None] * len(nodes)
    for nid, node in enumerate(nodes):
        if node['op'] != 'null':
            classes[nid] = policy.classify(node['op'], node.get('attrs', {}), node['name'])

    def wants_low(nid, pos):
        node = nodes[nid]
        op = node['op']
        return (classes[nid][0] == LOW_PRECISION and pos not in policy.index_inputs(op)
                and pos not in policy.float32_inputs(op))

    lp_params = set(stored_lp)
    if cast_params:
        users = _consumers(nodes)
        for nid, node in enumerate(nodes):
            if (node['op'] == 'null' and node['name'] not in data_names
                    and orig[(nid, 0)] == 'float32' and users[nid]
                    and all(wants_low(c, pos) for c, pos in users[nid])):
                lp_params.add(node['name'])

    decisions, dtypes = [], {}
    for nid, node in enumerate(nodes):
        if node['op'] == 'null':
            d = input_dtypes.get(node['name'], orig[(nid, 0)])
            if node['name'] in stored_lp:
                # The rule starts as cast_params' does: the builder stores both the same way.
                dec = _Decision('variable', 'parameter stored in %s (cast_params by '
                                'follow_params: its consumers follow %s data)' % (lp, lp),
                                lp, [lp], [])
            elif node['name'] in lp_params:
                dec = _Decision('variable', 'parameter stored in %s (cast_params: every '
                                'consumer is a low-precision op)' % lp, lp, [lp], [])
            else:
                kind = 'data input' if node['name'] in data_names else 'parameter'
                dec = _Decision('variable', kind, d, [d], [])
            decisions.append(dec)
            dtypes[(nid, 0)] = dec.outputs[0]
            continue
        op = node['op']
        op_class, rule = classes[nid]
        in_dtypes = [dtypes[(src, idx)] for src, idx, _ in node['inputs']]
        skip = set(policy.index_inputs(op)) | set(policy.float32_inputs(op))
        data_pos = [p for p, d in enumerate(in_dtypes) if _is_float(d) and p not in skip]
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
        decisions.append(_Decision(op_class, rule, compute if compute in _LOW else
                                   ('float32' if any(_is_float(o) for o in outputs) else None),
                                   outputs, wants))
    return decisions, lp_params


# ---------------------------------------------------------------------------------------------
# Rewrite
# ---------------------------------------------------------------------------------------------
class _Builder:
    """Emits the new node list: original nodes in order, casts shared per (tensor, dtype)."""

    def __init__(self, js, emulate, lp):
        self.js = js
        self.emulate = emulate
        self.lp = lp
        self.nodes = []
        self.names = {n['name'] for n in js['nodes']}
        self.casts = {}     # (old nid, out, logical dtype) -> [new nid, out]
        self.where = {}     # (old nid, out) -> [new nid, out] physical location
        self.logical = {}   # (old nid, out) -> logical dtype

    def _unique(self, name):
        base, i = name, 1
        while name in self.names:
            name = '%s%d' % (base, i)
            i += 1
        self.names.add(name)
        return name

    def _cast_node(self, entry, dtype, name, role):
        self.nodes.append({'op': 'amp_cast', 'name': self._unique(name),
                           'attrs': {MARK: role, 'dtype': dtype},
                           'inputs': [[entry[0], entry[1], 0]]})
        return [len(self.nodes) - 1, 0]

    def _tensor_name(self, nid, out):
        name = self.js['nodes'][nid]['name']
        return name if out == 0 else '%s_out%d' % (name, out)

    def _round_trip(self, entry, base):
        """Round a float32-held tensor through the target dtype (emulation)."""
        if self.lp == 'bfloat16':
            return self._round_bfloat16(entry, base)
        low = self._cast_node(entry, self.lp, base + '_amp_cast_' + self.lp, 'emulate')
        return self._cast_node(low, 'float32', base + '_amp_cast_' + self.lp + '_emulate',
                               'emulate')

    def _emulate_node(self, op, name, inputs, attrs=None):
        node_attrs = {MARK: 'emulate', ROUND_MARK: self.lp}
        node_attrs.update(attrs or {})
        self.nodes.append({'op': op, 'name': self._unique(name), 'attrs': node_attrs,
                           'inputs': [[e[0], e[1], 0] for e in inputs]})
        return [len(self.nodes) - 1, 0]

    def _round_bfloat16(self, entry, base):
        """Round float32 values to bfloat16 (8 significant bits) with elementwise ops.

        MXNet 1.9.1's float32<->bfloat16 ``amp_cast`` runs about 30x slower than an elementwise
        op on AVX2 CPUs (measured: 180 ms per round trip of a 1.6M-element tensor, against
        6 ms for float16), which made emulated bfloat16 training 46x slower than float32.
        Veltkamp's splitting rounds to nearest even in three operations: with
        ``t = u * (2**16 + 1)``, ``t - (t - u)`` is ``u`` rounded to 24 - 16 = 8 bits
        (Dekker, "A floating-point technique for extending the available precision", 1971).
        ``u = x * 2**-16`` keeps ``t`` from overflowing; the result is scaled back exactly.
        It equals ``amp_cast`` to bfloat16 for normal values, infinities and NaN (checked
        against a NumPy reference in tests/test_emulation.py); below 2**-110 it keeps fewer
        bits, and float32 subnormals (below 2**-126), which the cast flushes to zero, come out
        as tiny nonzero values. Unlike the cast, its gradient is the identity (the clip's
        gradient is 1 except on the clipped infinities):
        emulated bfloat16 rounds forward values, not gradients (float16 emulation rounds both;
        bfloat16 has float32's exponent range, so no gradient underflows there).
        """
        # +-inf would give inf - inf = NaN below: clip to 3.4e38, which still rounds to inf
        # (bfloat16's largest finite value is 3.3895e38) and keeps t finite.
        bounded = self._emulate_node('clip', base + '_bf16_bound', [entry],
                                     {'a_min': '-3.4e+38', 'a_max': '3.4e+38'})
        u = self._emulate_node('_mul_scalar', base + '_bf16_scale_down', [bounded],
                               {'scalar': '1.52587890625e-05'})
        t = self._emulate_node('_mul_scalar', base + '_bf16_split', [u], {'scalar': '65537.0'})
        low = self._emulate_node('elemwise_sub', base + '_bf16_low', [t, u])
        high = self._emulate_node('elemwise_sub', base + '_bf16_high', [t, low])
        return self._emulate_node('_mul_scalar', base + '_amp_round_bfloat16', [high],
                                  {'scalar': '65536.0'})

    def get(self, nid, out, dtype):
        """Entry of tensor (nid, out) in logical dtype ``dtype`` (None: as it is)."""
        have = self.logical[(nid, out)]
        if dtype is None or dtype == have:
            return list(self.where[(nid, out)])
        key = (nid, out, dtype)
        if key not in self.casts:
            src = self.where[(nid, out)]
            name = self._tensor_name(nid, out)
            if self.emulate and dtype in _LOW:
                self.casts[key] = self._round_trip(src, name)
            else:
                # Real graph: one cast. Emulation, up-cast: the tensor is already held in
                # float32; the cast stays so the graph matches the real one node for node.
                self.casts[key] = self._cast_node(src, dtype, '%s_amp_cast_%s' % (name, dtype),
                                                  'cast')
        return list(self.casts[key])

    def add(self, nid, node, decision):
        if node['op'] == 'null':
            new = dict(node)
            if decision.dtype in _LOW and decision.op_class == 'variable' and \
                    decision.rule.startswith('parameter stored'):
                attrs = dict(node.get('attrs', {}))
                # Keep the variable's own __dtype__ (if any) so remove_casts can restore it.
                attrs[MARK] = 'cast_param:' + attrs.get('__dtype__', '')
                attrs['__dtype__'] = _MSHADOW_ENUM[decision.dtype]
                new['attrs'] = attrs
            self.nodes.append(new)
            me = len(self.nodes) - 1
            self.logical[(nid, 0)] = decision.outputs[0]
            self.where[(nid, 0)] = [me, 0]
            if self.emulate and decision.outputs[0] in _LOW:
                # A low-precision parameter feeds float32 kernels through one up-cast.
                self.where[(nid, 0)] = self._cast_node(
                    [me, 0], 'float32', node['name'] + '_amp_cast_float32_emulate', 'emulate')
            return
        new = dict(node)
        new['inputs'] = []
        for (src, out, version), want in zip(node['inputs'], decision.wants):
            entry = self.get(src, out, want)
            new['inputs'].append([entry[0], entry[1], version])
        self.nodes.append(new)
        me = len(self.nodes) - 1
        for k, d in enumerate(decision.outputs):
            self.logical[(nid, k)] = d
            self.where[(nid, k)] = [me, k]
            if self.emulate and d in _LOW:
                self.where[(nid, k)] = self._round_trip([me, k], self._tensor_name(nid, k))


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


def _prepare(sym, target_dtype, policy, emulate, data_dtypes, data_names):
    js = _load(sym)
    policy = _make_policy(target_dtype, policy, emulate)
    previous = _previous_conversion(js)
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
    if previous is not None or any(node.get('attrs', {}).get(MARK) is not None
                                   for node in js['nodes']):
        js = _strip(js)  # same target: converting again gives the same graph
    input_dtypes = {}
    for name, d in (data_dtypes or {}).items():
        input_dtypes[name] = _dtype_name(d) if not isinstance(d, str) else d
    names = set(data_names if data_names is not None else ('data',)) | set(input_dtypes)
    return js, policy, input_dtypes, names


def convert_symbol(sym, target_dtype=None, policy=None, data_dtypes=None, cast_params=False,
                   emulate=None, data_names=None):
    """Convert a float32 Symbol to mixed precision.

    Args:
        sym (mxnet.symbol.Symbol): the float32 graph (a Module's symbol, or a Gluon block traced
            with ``block(mx.sym.var('data'))``).
        target_dtype (str): ``'bfloat16'`` (default) or ``'float16'``; may be omitted when
            ``policy`` is given.
        policy (mxmp.Policy): op classes and overrides; default ``Policy(target_dtype)``.
        data_dtypes (dict of str -> dtype): dtypes of the graph's data inputs (default float32);
            a data input given in the target dtype needs no cast.
        cast_params (bool): store the parameters whose every consumer is a low-precision op in
            the target dtype (their variables get the dtype; the caller must cast the arrays).
            Default False: parameters stay float32 with a shared in-graph cast.
        emulate (bool): float32 kernels with low-precision rounding (module docstring).
            Default: the policy's (False).
        data_names (iterable of str): inputs that are not parameters (never stored in the
            target dtype); default ``('data',)`` plus the keys of ``data_dtypes``.

    Returns:
        mxnet.symbol.Symbol: the same graph with ``amp_cast`` nodes at the precision boundaries;
        float32 outputs. Every float variable not in ``data_names`` carries its dtype
        (``__dtype__``), so plain MXNet binds the graph (``mx.mod.Module``, ``simple_bind``,
        ``gluon.SymbolBlock``) without being told the parameters' dtypes. Converting its
        result again with the same target dtype returns an identical graph.

    Raises:
        ValueError: unknown dtype; a graph already converted to another dtype, or holding casts
            from ``mxnet.contrib.amp``; a graph MXNet cannot type.
        RuntimeError: MXNet's type inference disagrees with the plan (an op-list bug; the
            message names the node and a ``Policy(fp32_ops=...)`` workaround).
    """
    js, policy, input_dtypes, names = _prepare(sym, target_dtype, policy, emulate, data_dtypes,
                                               data_names)
    decisions, _ = _plan(js, policy, input_dtypes, cast_params, names)
    builder = _Builder(js, policy.emulate, policy.target_dtype)
    for nid, (node, dec) in enumerate(zip(js['nodes'], decisions)):
        builder.add(nid, node, dec)
        if logger.isEnabledFor(logging.DEBUG) and node['op'] != 'null':
            logger.debug('%s %s -> %s: %s', node['op'], node['name'], dec.dtype, dec.rule)
    heads = [builder.get(nid, out, 'float32' if builder.logical[(nid, out)] in _LOW else None)
             + [0] for nid, out, _ in js['heads']]
    # Every parameter's dtype goes into the graph, so that plain MXNet binds it.
    pin_variable_dtypes(builder.nodes, {
        node['name']: builder.logical[(nid, 0)] for nid, node in enumerate(js['nodes'])
        if node['op'] == 'null' and node['name'] not in names})
    out = dict(js)
    out['nodes'] = builder.nodes
    out['heads'] = heads
    result = _dump(out)
    _check_types(result, builder, input_dtypes)
    return result


def _check_types(result, builder, input_dtypes):
    """MXNet's type inference on the converted graph must match the plan, node by node."""
    try:
        inferred = _infer_dtypes(json.loads(result.tojson(remove_amp_cast=False)),
                                 input_dtypes)
    except ValueError as err:
        raise RuntimeError('the converted graph does not type-check in MXNet (%s); an op list '
                           'is wrong for one of its ops: please report it, and keep the op in '
                           'float32 meanwhile with Policy(fp32_ops=[...])' % err) from err
    for (nid, k), want in builder.logical.items():
        new_nid, new_k = builder.where[(nid, k)]
        if builder.emulate and want in _LOW:
            want = 'float32'
        node = builder.nodes[new_nid]
        got = inferred.get((node['name'], new_k))
        if want != got:
            raise RuntimeError(
                'mxmp planned %s for output %d of node %s (%s) but MXNet infers %s: an op-list '
                'bug; please report it, and keep the op in float32 meanwhile with '
                'mxmp.Policy(..., fp32_ops=[%r])' % (want, k, node['name'], node['op'], got,
                                                     node['op']))


def explain(sym, target_dtype=None, policy=None, data_dtypes=None, cast_params=False,
            data_names=None):
    """List the pass's decision for every node of ``sym``.

    Args: as :func:`convert_symbol` (``sym`` may be float32 or already converted; casts are
        ignored).

    Returns:
        list of :class:`ExplainRow` ``(name, op, dtype, rule)``, one per node in topological
        order; variables have op ``'null'``. ``format_explain(rows)`` prints them as a table.
    """
    js, policy, input_dtypes, names = _prepare(sym, target_dtype, policy, None, data_dtypes,
                                               data_names)
    decisions, _ = _plan(js, policy, input_dtypes, cast_params, names)
    return [ExplainRow(node['name'], node['op'], dec.dtype, dec.rule)
            for node, dec in zip(js['nodes'], decisions)]


def format_explain(rows, include_variables=False):
    """Render :func:`explain` rows, one line each: ``FullyConnected fc1 -> float16: rule``."""
    lines = []
    for row in rows:
        if row.op == 'null' and not include_variables:
            continue
        lines.append('%s %s -> %s: %s' % (row.op if row.op != 'null' else 'variable', row.name,
                                         row.dtype, row.rule))
    return '\n'.join(lines)
