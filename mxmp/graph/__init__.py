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

Graphs that already hold casts convert. :func:`mxmp.casts.cast_origin` says who wrote each one:
mxmp's casts (marked) and ``mxnet.contrib.amp``'s (named ``<tensor>_amp_cast_<dtype>`` and
``<node>_<k>_amp_multicast`` by its pass) only mark precision boundaries, so they are removed
and the pass plans the float32 graph again with mxmp's lists: converting contrib.amp's output
gives the same graph as converting the float32 graph. Casts the model's own code wrote
(GluonCV's ``amp_multicast`` in front of ``box_decode``, ``Cast`` to an index dtype) are part of
what the model computes: they stay, their inputs arrive uncast, and their outputs have the
dtypes MXNet gives them (an ``amp_multicast`` with ``cast_narrow=True`` of a bfloat16 and a
float32 tensor gives two bfloat16 tensors, as it would under contrib.amp). A variable whose
``__dtype__`` is a low-precision dtype (contrib.amp's ``cast_optional_params=True``) keeps it.

Nodes are identified by their position in the graph JSON, never by name: a block called twice
(a shared activation, a weight-tied encoder) gives nodes with equal names, which convert like
any other; the casts the pass adds get unique names.

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

from ..casts import (_CAST_OPS, _LOW, _MSHADOW_ENUM, MARK, ROUND_MARK,  # noqa: F401
                    _dtype_name, _dump, _load, _previous_conversion, _strip, cast_origin,
                    cast_origins, converted_dtype, count_casts, pin_variable_dtypes,
                    remove_casts)
from ..policy import FLOAT32, LOSS_OUTPUT, LOW_PRECISION, Policy, normalize_dtype

__all__ = ['convert_symbol', 'remove_casts', 'explain', 'format_explain', 'ExplainRow',
           'count_casts', 'converted_dtype', 'cast_origins']

logger = logging.getLogger(__name__)

_RANK = {'float16': 1, 'bfloat16': 1, 'float32': 2, 'float64': 3}

#: Pseudo op class of the amp_cast/amp_multicast nodes that the model's own code wrote.
_MODEL_CAST = 'model_cast'

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
    """(node id, out) -> dtype name of every visible output of a graph, from MXNet.

    Node ids are positions in ``js['nodes']``; names play no part, so a graph whose blocks are
    called twice (two nodes named ``relu0_fwd``) types like any other. Inputs without a dtype
    (given by name, or a ``__dtype__`` attribute) are taken as float32. Nodes that no head
    reaches are absent.
    """
    # A bfloat16 input must be typed through its variable's ``__dtype__`` attribute: MXNet
    # 1.9.1's Symbol.infer_type(_partial) silently drops bfloat16 keyword arguments (their numpy
    # type, np.void, is not in _DTYPE_NP_TO_MX), which left the input untyped and made
    # convert_symbol(..., 'bfloat16', data_dtypes={'data': 'bfloat16'}) raise (found by
    # tests/test_graph_fuzz.py). So bfloat16 and float16 inputs get the attribute on a copy.
    # Every node is renamed to its id on that copy: MXNet reports types per output name.
    nodes, args = [], {}
    for nid, node in enumerate(js['nodes']):
        attrs = node.get('attrs', {})
        d = input_dtypes.get(node['name'])
        if node['op'] == 'null':
            if d in _MSHADOW_ENUM and '__dtype__' not in attrs:
                attrs = dict(attrs, __dtype__=_MSHADOW_ENUM[d])
            if '__dtype__' not in attrs:
                args[str(nid)] = np.dtype(d or 'float32')
        nodes.append(dict(node, name=str(nid), attrs=attrs))
    internals = _dump(dict(js, nodes=nodes)).get_internals()
    try:
        _, out_types, _ = internals.infer_type_partial(**args)
    except Exception as err:  # MXNetError: inconsistent dtypes
        names = [n['name'] for n in js['nodes']]
        message = _renamed_back(str(err), names)
        raise ValueError('MXNet cannot infer the dtypes of the graph: %s' % message) from err
    result, previous, k = {}, None, 0
    for p, dtype in enumerate(out_types):
        owner = int(internals[p].name)
        k = k + 1 if owner == previous else 0
        previous = owner
        result[(owner, k)] = _dtype_name(dtype)
    return result


def _renamed_back(message, names):
    """MXNet's error text with the ids of :func:`_infer_dtypes`' renamed nodes as names."""
    import re
    return re.sub(r'(operator |node )(\d+)\b',
                  lambda m: m.group(1) + (names[int(m.group(2))]
                                          if int(m.group(2)) < len(names) else m.group(2)),
                  message)


def _node_output_dtypes(node, in_dtypes, n_out):
    """Output dtypes MXNet gives one node for the given input dtypes (a one-node graph)."""
    from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX
    enum = {_dtype_name(t): str(v) for t, v in _DTYPE_NP_TO_MX.items() if t is not None}
    nodes = [{'op': 'null', 'name': 'i%d' % i, 'inputs': [], 'attrs': {'__dtype__': enum[d]}}
             for i, d in enumerate(in_dtypes)]
    nodes.append(dict(node, inputs=[[i, 0, 0] for i in range(len(in_dtypes))]))
    js = {'nodes': nodes, 'heads': [[len(in_dtypes), k, 0] for k in range(n_out)],
          'attrs': {'mxnet_version': ['int', 10901]}}
    types = _infer_dtypes(js, {})
    return [types.get((len(in_dtypes), k)) for k in range(n_out)]


def _original_dtypes(js, input_dtypes):
    """(nid, out) -> dtype name of every visible output of the input graph."""
    return _infer_dtypes(js, input_dtypes)


def _pinned_low(js):
    """{variable name: dtype} of variables whose ``__dtype__`` is a low-precision dtype that
    mxmp did not set (contrib.amp's ``cast_optional_params=True``, or the user's own)."""
    low = {v: k for k, v in _MSHADOW_ENUM.items()}
    return {n['name']: low[n['attrs']['__dtype__']] for n in js['nodes']
            if n['op'] == 'null' and n.get('attrs', {}).get('__dtype__') in low}


def _consumers(nodes):
    users = collections.defaultdict(list)  # nid -> [(consumer nid, input position)]
    for nid, node in enumerate(nodes):
        for pos, (src, _, _) in enumerate(node['inputs']):
            users[src].append((nid, pos))
    return users


def _plan(js, policy, input_dtypes, cast_params, data_names, pinned=()):
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
    orig = _original_dtypes(dict(js, nodes=untyped), {n: 'float32' if d in _LOW else d
                                                      for n, d in input_dtypes.items()})
    classes = [None] * len(nodes)
    for nid, node in enumerate(nodes):
        if node['op'] in _CAST_OPS and cast_origin(node) == 'model':  # others were stripped
            classes[nid] = (_MODEL_CAST, 'cast written by the model: kept, computes as in MXNet')
        elif node['op'] != 'null':
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
                    and node['name'] not in input_dtypes and orig[(nid, 0)] == 'float32'
                    and users[nid]
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
                if node['name'] in pinned:
                    kind = 'parameter stored in %s (its __dtype__ attribute)' % d
                dec = _Decision('variable', kind, d, [d], [])
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
            outputs = (_node_output_dtypes(node, in_dtypes, n_out) if None not in in_dtypes
                       else [orig[(nid, k)] for k in range(n_out)])
            for k, d in enumerate(outputs):
                dtypes[(nid, k)] = d
            low = [d for d in outputs if d in _LOW]
            decisions.append(_Decision(op_class, rule, low[0] if low else (
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
        self.raw = {}       # (old nid, out) -> [new nid, out] where the node writes it
        # Emulation: (old nid, out) -> 'round' (a float32-held low-precision tensor, rounded
        # through the target dtype) or 'up' (a tensor really in low precision, cast to float32)
        # before its first use. Made on first use, so an output nobody reads (an LSTM's states,
        # split(...)[1:]) gets no dangling round trip, which MXNet would drop from the graph.
        self.pending = {}
        self.kind = {}      # the same, kept after the nodes are made

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

    def _location(self, nid, out):
        """Where tensor (nid, out) is read from, making its pending emulation nodes."""
        kind = self.pending.pop((nid, out), None)
        if kind == 'round':
            self.where[(nid, out)] = self._round_trip(self.raw[(nid, out)],
                                                      self._tensor_name(nid, out))
        elif kind == 'up':
            self.where[(nid, out)] = self._cast_node(
                self.raw[(nid, out)], 'float32',
                self._tensor_name(nid, out) + '_amp_cast_float32_emulate', 'emulate')
        return self.where[(nid, out)]

    def get(self, nid, out, dtype):
        """Entry of tensor (nid, out) in logical dtype ``dtype`` (None: as it is)."""
        have = self.logical[(nid, out)]
        if dtype is None or dtype == have:
            return list(self._location(nid, out))
        key = (nid, out, dtype)
        if key not in self.casts:
            src = self._location(nid, out)
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
                    decision.rule.startswith('parameter stored in %s (cast_params' % self.lp):
                attrs = dict(node.get('attrs', {}))
                # Keep the variable's own __dtype__ (if any) so remove_casts can restore it.
                attrs[MARK] = 'cast_param:' + attrs.get('__dtype__', '')
                attrs['__dtype__'] = _MSHADOW_ENUM[decision.dtype]
                new['attrs'] = attrs
            self.nodes.append(new)
            me = len(self.nodes) - 1
            self._place(nid, 0, [me, 0], decision.outputs[0], physical_low=True)
            return
        new = dict(node)
        new['inputs'] = []
        for (src, out, version), want in zip(node['inputs'], decision.wants):
            entry = self.get(src, out, want)
            new['inputs'].append([entry[0], entry[1], version])
        self.nodes.append(new)
        me = len(self.nodes) - 1
        # Under emulation every tensor is held in float32, except the outputs of the nodes
        # that set their dtype themselves: a model's amp_cast to a low-precision dtype, Cast.
        fixes_dtype = node['op'] in ('amp_cast', 'Cast', 'cast')
        for k, d in enumerate(decision.outputs):
            self._place(nid, k, [me, k], d, physical_low=fixes_dtype)

    def _place(self, nid, k, entry, dtype, physical_low):
        self.logical[(nid, k)] = dtype
        self.raw[(nid, k)] = entry
        self.where[(nid, k)] = entry
        if self.emulate and dtype in _LOW:
            self.pending[(nid, k)] = self.kind[(nid, k)] = 'up' if physical_low else 'round'

    def physical(self, nid, k):
        """The dtypes MXNet must infer for tensor (nid, k): (where its node writes it, where
        consumers read it)."""
        want = self.logical[(nid, k)]
        if not self.emulate or want not in _LOW:
            return want, want
        return (want if self.kind[(nid, k)] == 'up' else 'float32'), 'float32'


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
    # contrib.amp's casts go too (cast_origin): the float32/low-precision decisions are
    # mxmp's, made again on the float32 graph; the model's own casts stay.
    if previous is not None or any(node.get('attrs', {}).get(MARK) is not None or
                                   cast_origin(node) == 'contrib.amp' for node in js['nodes']):
        js = _strip(js)  # same target: converting again gives the same graph
    input_dtypes = {}
    for name, d in (data_dtypes or {}).items():
        input_dtypes[name] = _dtype_name(d) if not isinstance(d, str) else d
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

    Graphs that already hold casts are accepted (module docstring): mxmp's and contrib.amp's
    casts are re-planned, the model's own casts kept.

    Raises:
        ValueError: unknown dtype; a graph already converted by mxmp to another dtype (the
            message names ``remove_casts``); variables stored (``__dtype__``) in the other
            low-precision dtype; a graph MXNet cannot type.
        RuntimeError: MXNet's type inference disagrees with the plan. At a node of the graph:
            an op-list bug, the message names the node, its op and a ``Policy(fp32_ops=...)``
            workaround; at a node the pass wrote: a bug of the pass, to report.
    """
    js, policy, input_dtypes, names, pinned = _prepare(sym, target_dtype, policy, emulate,
                                                       data_dtypes, data_names)
    decisions, _ = _plan(js, policy, input_dtypes, cast_params, names, pinned)
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
    _check_types(out, builder, input_dtypes, js['nodes'])
    return result


def _check_types(graph, builder, input_dtypes, original):
    """MXNet's type inference on the converted graph (JSON ``graph``, the builder's node list)
    must match the plan, tensor by tensor, where each node writes it and where it is read."""
    try:
        inferred = _infer_dtypes(graph, input_dtypes)
    except ValueError as err:
        raise RuntimeError('the converted graph does not type-check in MXNet (%s); an op list '
                           'is wrong for one of its ops: please report it, and keep the op in '
                           'float32 meanwhile with Policy(fp32_ops=[...])' % err) from err
    for (nid, k) in builder.logical:
        written, read = builder.physical(nid, k)
        source = original[nid]
        got = inferred.get(tuple(builder.raw[(nid, k)]))
        if got != written:
            if source['op'] == 'null' or cast_origin(source) is not None:
                raise RuntimeError(
                    'mxmp planned %s for output %d of %s %s but MXNet infers %s: a bug of the '
                    'mxmp pass; please report it with the graph (sym.save(path))'
                    % (written, k, 'variable' if source['op'] == 'null' else source['op'],
                       source['name'], got))
            raise RuntimeError(
                'mxmp planned %s for output %d of node %s (%s) but MXNet infers %s: the op lists '
                'are wrong for %s; please report it, and keep the op in float32 meanwhile with '
                'mxmp.Policy(..., fp32_ops=[%r])' % (written, k, source['name'], source['op'],
                                                     got, source['op'], source['op']))
        if builder.where[(nid, k)] != builder.raw[(nid, k)]:
            node = builder.nodes[builder.where[(nid, k)][0]]
            got = inferred.get(tuple(builder.where[(nid, k)]))
            if got != read:
                raise RuntimeError(
                    'mxmp planned %s for output %d of node %s (%s), read through the emulation '
                    'node %s (%s), but MXNet infers %s there: a bug of the mxmp pass, not of the '
                    'op lists; please report it with the graph (sym.save(path))'
                    % (read, k, source['name'], source['op'], node['name'], node['op'], got))


def explain(sym, target_dtype=None, policy=None, data_dtypes=None, cast_params=False,
            data_names=None):
    """List the pass's decision for every node of ``sym``.

    Args: as :func:`convert_symbol` (``sym`` may be float32 or already converted; casts are
        ignored).

    Returns:
        list of :class:`ExplainRow` ``(name, op, dtype, rule)``, one per node in topological
        order; variables have op ``'null'``. ``format_explain(rows)`` prints them as a table.
    """
    js, policy, input_dtypes, names, pinned = _prepare(sym, target_dtype, policy, None,
                                                       data_dtypes, data_names)
    decisions, _ = _plan(js, policy, input_dtypes, cast_params, names, pinned)
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
