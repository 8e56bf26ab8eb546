"""The mixed-precision graph pass: :func:`convert_symbol`.

Plan (:mod:`.plan`), then rewrite: an ``amp_cast`` goes on every edge whose source dtype
differs from what the consumer needs, one per (tensor, dtype); outputs are cast back to float32.
Then MXNet's type inference on the new graph must agree with the plan, node by node. Emulation
holds every low-precision tensor in float32, rounded through the target dtype where it is
produced. How and why: docs/pass.md.
"""
from ..dtypes import LOW_PRECISION_DTYPES as _LOW, MSHADOW_ENUM
from .kernel_rule import original_op, with_kernel_dtype
from .plan import prepare
from .symbol_json import (MARK, ROUND_MARK, cast_origin, dump, infer_dtypes,
    pin_variable_dtypes, storage_mark, unique_name)

__all__ = ['convert_symbol']


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
        # before its first use. Made on first use (until then ``where`` is ``raw``), so an output
        # nobody reads (an LSTM's states, split(...)[1:]) gets no dangling round trip, which
        # MXNet would drop from the graph.
        self.kind = {}

    def _node(self, op, name, inputs, attrs):
        self.nodes.append({'op': op, 'name': unique_name(name, self.names), 'attrs': attrs,
                           'inputs': [[e[0], e[1], 0] for e in inputs]})
        return [len(self.nodes) - 1, 0]

    def _cast_node(self, entry, dtype, name, role):
        return self._node('amp_cast', name, [entry], {MARK: role, 'dtype': dtype})

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
        return self._node(op, name, inputs,
                          dict({MARK: 'emulate', ROUND_MARK: self.lp}, **(attrs or {})))

    def _round_bfloat16(self, entry, base):
        """Round float32 values to bfloat16 (to nearest even) with elementwise ops: Veltkamp's
        splitting, ``t - (t - u)`` with ``t = u * (2**16 + 1)``, ``u = x * 2**-16`` (Dekker,
        1971). Equal to ``amp_cast`` for normal values, infinities and NaN; its gradient is the
        identity (forward values are rounded, gradients are not). Why: docs/pass.md."""
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
        key, name = (nid, out), self._tensor_name(nid, out)
        if key in self.kind and self.where[key] is self.raw[key]:
            self.where[key] = (self._round_trip(self.raw[key], name) if self.kind[key] == 'round'
                               else self._cast_node(self.raw[key], 'float32',
                                                    name + '_amp_cast_float32_emulate', 'emulate'))
        return self.where[key]

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
        new = dict(node)
        if node['op'] == 'null' and decision.stored_dtype is not None:
            attrs = dict(node.get('attrs', {}))
            attrs[MARK] = storage_mark(decision.stored_dtype, attrs)
            attrs['__dtype__'] = MSHADOW_ENUM[decision.stored_dtype]
            new['attrs'] = attrs
        elif node['op'] != 'null':
            new['inputs'] = [self.get(src, out, want) + [version] for (src, out, version), want
                             in zip(node['inputs'], decision.wants)]
            if original_op(node) is not None and decision.dtype in _LOW and not self.emulate:
                new = with_kernel_dtype(new, decision.dtype)   # for mxnet_ops' casts
        self.nodes.append(new)
        # Under emulation every tensor is held in float32, except variables and the outputs of
        # the nodes that set their dtype themselves: a model's amp_cast to a low-precision
        # dtype, Cast.
        physical_low = node['op'] in ('null', 'amp_cast', 'Cast', 'cast')
        for k, d in enumerate(decision.outputs):
            self._place(nid, k, [len(self.nodes) - 1, k], d, physical_low)

    def _place(self, nid, k, entry, dtype, physical_low):
        self.logical[(nid, k)] = dtype
        self.raw[(nid, k)] = entry
        self.where[(nid, k)] = entry
        if self.emulate and dtype in _LOW:
            self.kind[(nid, k)] = 'up' if physical_low else 'round'

    def physical(self, nid, k):
        """The dtypes MXNet must infer for tensor (nid, k): (where its node writes it, where
        consumers read it)."""
        want = self.logical[(nid, k)]
        if not self.emulate or want not in _LOW:
            return want, want
        return (want if self.kind[(nid, k)] == 'up' else 'float32'), 'float32'


def convert_symbol(sym, target_dtype=None, policy=None, data_dtypes=None, cast_params=None,
                   emulate=None, data_names=None):
    """Convert a float32 Symbol to mixed precision.

    Args:
        sym (mxnet.symbol.Symbol): the graph (float32, or holding casts: mxmp's and contrib.amp's
            are planned again, the model's own kept).
        target_dtype, cast_params, emulate: shorthands for fields of ``policy`` (docs/pass.md):
            ``cast_params=True`` stores the parameters whose every consumer takes them in the
            target dtype in that dtype (the caller casts the arrays:
            :func:`mxmp._src.graph.strip.arrays_for_graph`); ``emulate='auto'`` is False here.
        policy (mxmp.Policy): every precision setting; default ``Policy(target_dtype)``.
        data_dtypes (dict of str -> dtype): dtypes of data inputs (default float32).
        data_names (iterable of str): inputs that are not parameters; default ``('data',)``
            plus the keys of ``data_dtypes``.

    Returns:
        mxnet.symbol.Symbol: the graph with ``amp_cast`` nodes at the precision boundaries,
        float32 outputs, every float parameter's ``__dtype__`` written (plain MXNet binds it).
        Converting it again with the same policy returns an identical graph.

    A bfloat16 conversion on oneDNN's real kernels also tunes glibc's malloc, once per process
    (:func:`mxmp._src.malloc_tuning.tune_malloc`; ``MXMP_MALLOC=default`` keeps the defaults).

    Raises:
        TypeError: ``sym`` is not a Symbol; ``policy`` is not a Policy.
        ValueError: a bad ``MXMP_MALLOC``; unknown dtype; a keyword contradicting ``policy``; a
            graph converted to the other dtype (use ``remove_casts``); variables stored in the
            other low-precision dtype; a graph MXNet cannot type.
        RuntimeError: MXNet's type inference disagrees with the plan (an op-list bug at a node
            of the graph, the message names a ``Policy(fp32_ops=...)`` workaround; else a bug of
            the pass).
    """
    js, policy, input_dtypes, names, decisions = prepare(sym, target_dtype, policy, emulate,
                                                         data_dtypes, data_names, cast_params)
    from ..cpu_tier import warn_if_slower_than_float32   # on first use: import mxmp stays small
    warn_if_slower_than_float32(policy.target_dtype, policy.emulate)
    from ..malloc_tuning import tune_for_conversion   # bfloat16 on oneDNN: glibc's malloc tuned
    tune_for_conversion(policy.target_dtype, policy.emulate)
    builder = _Builder(js, policy.emulate, policy.target_dtype)
    for nid, (node, dec) in enumerate(zip(js['nodes'], decisions)):
        builder.add(nid, node, dec)
    heads = [builder.get(nid, out, 'float32' if builder.logical[(nid, out)] in _LOW else None)
             + [0] for nid, out, _ in js['heads']]
    # Every parameter's dtype goes into the graph, so that plain MXNet binds it.
    pin_variable_dtypes(builder.nodes, {
        node['name']: builder.logical[(nid, 0)] for nid, node in enumerate(js['nodes'])
        if node['op'] == 'null' and node['name'] not in names})
    out = dict(js, nodes=builder.nodes, heads=heads)
    from . import concat_rule   # loaded by the first conversion, not by `import mxmp`
    out = concat_rule.substitute(out, names)   # one node for one: the builder's ids hold
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
        where = builder.where[(nid, k)]
        if where != builder.raw[(nid, k)] and inferred.get(tuple(where)) != read:
            node = builder.nodes[where[0]]
            raise RuntimeError(
                'mxmp planned %s for output %d of node %s (%s), read through the emulation '
                'node %s (%s), but MXNet infers %s there: a bug of the mxmp pass, not of the '
                'op lists; please report it with the graph (sym.save(path))'
                % (read, k, source['name'], source['op'], node['name'], node['op'],
                   inferred.get(tuple(where))))

