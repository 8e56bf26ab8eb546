"""The mixed-precision graph pass over an MXNet Symbol.

:func:`convert_symbol` rewrites a float32 Symbol into a mixed-precision one:

1. *Plan* (:mod:`mxmp._src.graph.plan`): walk the nodes in topological order;
   :meth:`mxmp._src.policy.policy.Policy.classify` gives each op a class, and the dtypes of its inputs
   (already decided) give the dtype it computes in: low-precision ops run in the target dtype,
   float32 ops in float32, widest-type and follow ops in the widest dtype among their float
   inputs. Integer tensors (indices, shapes) are never touched: which tensors are floating point
   comes from MXNet's own type inference (``Symbol.infer_type_partial``,
   :mod:`mxmp._src.graph.infer`) on the original graph.
2. *Rewrite* (here, ``_Builder``): an ``amp_cast`` node goes on every edge whose source dtype
   differs from what the consumer needs, and only there. Casts are shared: a tensor is cast at
   most once per dtype, whatever the number of its consumers. Graph outputs are cast back to
   float32.
3. *Check*: MXNet's type inference on the new graph must agree with the plan, node by node;
   a disagreement is an op-list bug and raises instead of producing a graph that fails later.

Every node's decision (op, dtype, the rule that chose it) is available from
:func:`mxmp._src.graph.explain.explain`.

Graphs that already hold casts convert. :func:`mxmp._src.graph.symbol_json.cast_origin` says who
wrote each one: mxmp's casts (marked) and ``mxnet.contrib.amp``'s (named
``<tensor>_amp_cast_<dtype>`` and ``<node>_<k>_amp_multicast`` by its pass) only mark precision
boundaries, so they are removed and the pass plans the float32 graph again with mxmp's lists:
converting contrib.amp's output gives the same graph as converting the float32 graph. Casts the
model's own code wrote (GluonCV's ``amp_multicast`` in front of ``box_decode``, ``Cast`` to an
index dtype) are part of what the model computes: they stay, their inputs arrive uncast, and
their outputs have the dtypes MXNet gives them (an ``amp_multicast`` with ``cast_narrow=True``
of a bfloat16 and a float32 tensor gives two bfloat16 tensors, as it would under contrib.amp). A
variable whose ``__dtype__`` is a low-precision dtype (contrib.amp's
``cast_optional_params=True``) keeps it.

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
import logging

from ..dtypes import LOW_PRECISION_DTYPES as _LOW, MSHADOW_ENUM
from .infer import infer_dtypes
from .plan import plan, prepare
from .symbol_json import (MARK, ROUND_MARK, cast_origin, cast_param_mark, dump,
    float32_param_mark, pin_variable_dtypes)

__all__ = ['convert_symbol']

logger = logging.getLogger(__name__)


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
            if decision.rule.startswith('parameter stored in float32 ('):
                attrs = dict(node.get('attrs', {}))
                attrs[MARK] = float32_param_mark(attrs)  # remove_casts restores __dtype__
                attrs['__dtype__'] = MSHADOW_ENUM['float32']
                new['attrs'] = attrs
            elif decision.dtype in _LOW and decision.op_class == 'variable' and \
                    decision.rule.startswith('parameter stored in %s (cast_params' % self.lp):
                attrs = dict(node.get('attrs', {}))
                # Keep the variable's own __dtype__ (if any) so remove_casts can restore it.
                attrs[MARK] = cast_param_mark(attrs)
                attrs['__dtype__'] = MSHADOW_ENUM[decision.dtype]
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
        cast_params (bool): store the parameters whose every consumer takes them in the
            target dtype (a low-precision op, or the model's own ``amp_cast`` to the target
            dtype; :mod:`mxmp._src.graph.plan`) in that dtype (their variables get the dtype; the
            caller must cast the arrays).
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
    js, policy, input_dtypes, names, pinned = prepare(sym, target_dtype, policy, emulate,
                                                      data_dtypes, data_names)
    decisions, _ = plan(js, policy, input_dtypes, cast_params, names, pinned)
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
    result = dump(out)
    _check_types(out, builder, input_dtypes, js['nodes'])
    return result


def _check_types(graph, builder, input_dtypes, original):
    """MXNet's type inference on the converted graph (JSON ``graph``, the builder's node list)
    must match the plan, tensor by tensor, where each node writes it and where it is read."""
    try:
        inferred = infer_dtypes(graph, input_dtypes)
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

