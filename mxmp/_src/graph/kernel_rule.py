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
- ``LeakyReLU(act_type='gelu')`` becomes ``mxmp_gelu``: the same erf form, float32 arithmetic
  inside, vectorised and parallel; in a BERT-base training step it ran 2% faster than MXNet
  1.9.1's bfloat16 GELU (docs/benchmark.md, "GELU and add_n in the bfloat16 step").
  Inference-only graphs put MXNet's op back, which oneDNN folds into the FullyConnected
  (:func:`.kernel_undo.inference_only`).
- The interleaved attention matmuls ``_contrib_interleaved_matmul_selfatt_qk/valatt`` and
  ``_encdec_qk/valatt`` become ``mxmp_selfatt_qk/valatt`` and ``mxmp_encdec_qk/valatt``, and
  ``batch_dot`` (dense; GluonNLP's ``DotProductAttentionCell`` computes its scores and context
  with it) becomes ``mxmp_batch_dot`` (:data:`ATTENTION`): the same products in bfloat16 (inputs and outputs; float32 inputs are
  rounded to nearest even) with float32 accumulation, where MXNet 1.9.1 has float32 kernels
  only. They are low-precision ops of the plan (every other library op is float32). Only in
  bfloat16 graphs (never in :func:`apply_kernels`' float32 graphs unless asked) and
  only on the ``avx512_bf16`` tier (:func:`mxmp._src.cpu_tier.cpu_tier`), where the library's
  AVX512-BF16 GEMM runs and was measured faster than MXNet's float32 op (docs/benchmark.md,
  "The attention matmuls"); on the other tiers its portable path is correct (``mxmp
  check-kernels``) but unmeasured, so MXNet's float32 op stays.
- The self-attention pair (:mod:`.selfatt_pair`): a tensor read by exactly one ``selfatt_qk``
  and one ``selfatt_valatt`` is read once, by the qk, which emits the values for the valatt,
  so that MXNet does not sum the two ops' gradients of it. The LayerNorm copy (:mod:`.ln_copy`):
  a library LayerNorm whose output has exactly two readers also outputs a copy for the second,
  and its backward sums the two gradients (no ``add_n``).

Every input but data is an MXNet "extra input" of the library op, shaped by MXNet's own ops
(:data:`EXTRA_INPUTS`): MXNet 1.9.1's wrapper of library ops then never meets an input of
unknown shape beside one with axes, which wrote past its buffer.

MXNet passes a library op no write/add request, so the library op always writes its
gradients: each graph variable it reads goes through a copy the rule adds (marked), whose
MXNet backward honours ``grad_req='add'``; and with ``MXNET_EXEC_ENABLE_ADDTO=1`` (gradients of
intermediate tensors accumulated in place) the rule stays off.

It is on for bfloat16 targets of a CPU (the library has CPU kernels only: :meth:`mxmp.Policy.on`
of another context turns it off) and off with ``Policy(kernels='mxnet')`` or
``MXMP_KERNELS=mxnet``. An op the user names in ``lp_ops`` or ``follow_ops`` keeps MXNet's op
in the user's class; the attention matmuls, low precision, keep MXNet's op when named in
``fp32_ops`` or ``follow_ops``, or their node in ``excluded_names``. :func:`mxmp.explain` names
it, from the graph's structure alone
(:func:`planned`: it never builds or loads the library).

The library ops take bfloat16 or float32 data (float32 arithmetic inside, outputs rounded
once), planned as follow ops of their data (:func:`.rule_notes.library_class`): no cast around.
Files mxmp writes hold MXNet's ops only (:func:`.kernel_undo.mxnet_ops`), so that plain MXNet loads them (a
library op the pass marked bfloat16, :data:`LOW_SUFFIX`, comes back in float32 between two
casts: MXNet 1.9.1 has no bfloat16 kernel for these ops); a graph that holds library ops loads
after ``import mxmp`` (:mod:`mxmp._src.kernels.loading`).
"""
import logging
import os

from .symbol_json import MARK, TRUE_STRINGS as _TRUE, unique_name

__all__ = ['KERNEL_PREFIX', 'INPUT_COPY', 'TIE', 'EXTRA_INPUTS', 'LOW_SUFFIX', 'FLOAT32_OUTPUTS',
           'FLOAT32_INPUTS', 'FLAG', 'substitute', 'apply_kernels', 'planned', 'restore',
           'replaces',
           'original_op', 'kernel_dtype', 'with_kernel_dtype']

logger = logging.getLogger('mxmp.kernels')

#: MARK value prefix of a substituted node; the original op name follows.
KERNEL_PREFIX = 'kernel:'
#: Separator of the dtype a library node runs in (``'kernel:LayerNorm@bfloat16'``), written by
#: the pass where that is a low-precision dtype held as such (not under emulation).
LOW_SUFFIX = '@'
#: Outputs (mean, rstd) that stay float32 and inputs (gamma, beta) taken in float32 by a
#: library op (and the MXNet op it replaces) whatever its data's dtype.
FLOAT32_OUTPUTS = FLOAT32_INPUTS = {'mxmp_layer_norm': (1, 2), 'LayerNorm': (1, 2)}
#: MARK value of a ``_copy`` the rule puts between a variable and a library op.
INPUT_COPY = 'kernel_input'
#: MARK value of the training-mode flag's nodes (a constant 1 and MXNet's Dropout of it).
FLAG = 'kernel_flag'
#: MXNet op -> library op: the low-precision library products (bfloat16 products, float32
#: accumulation; MXNet 1.9.1 has float32 CPU kernels only): the interleaved attention matmuls
#: and ``batch_dot`` (GluonNLP's ``DotProductAttentionCell``: its scores and context).
ATTENTION = {'_contrib_interleaved_matmul_selfatt_qk': 'mxmp_selfatt_qk',
             '_contrib_interleaved_matmul_selfatt_valatt': 'mxmp_selfatt_valatt',
             '_contrib_interleaved_matmul_encdec_qk': 'mxmp_encdec_qk',
             '_contrib_interleaved_matmul_encdec_valatt': 'mxmp_encdec_valatt',
             'batch_dot': 'mxmp_batch_dot'}
SUBSTITUTES = dict({'LayerNorm': 'mxmp_layer_norm', 'Dropout': 'mxmp_dropout',
                    'softmax': 'mxmp_softmax', 'LeakyReLU': 'mxmp_gelu'}, **ATTENTION)
#: Ops substituted only under ``Policy(kernels='all')``. ``batch_dot``: its products are 2.5x
#: faster in the library, but GluonNLP's attention cell feeds it from and into ``transpose``, which
#: the plan keeps in float32 (its bfloat16 kernel corrupts the heap), so in bfloat16 each attention
#: gains six casts, which took what the products saved in the machine-translation loop
#: (docs/benchmark.md, "GluonNLP's batch_dot in the library"). Dropout was opt-in until the
#: transformer study's +1.2% perplexity with it was traced to its other masks
#: (docs/accuracy.md, "mxmp's Dropout kernel"); GELU until a BERT-base training step measured it
#: faster than MXNet's bfloat16 GELU (``python -m benchmarks.kernels_ab --modes
#: float32,mxmp,mxmp_all_kernels`` before the change).
OPT_IN = ('batch_dot',)
#: Inputs of the MXNet op (the library op may take more: Dropout's flag).
_N_INPUTS = {'LayerNorm': 3, 'Dropout': 1, 'softmax': 2, 'LeakyReLU': 1,
             '_contrib_interleaved_matmul_selfatt_qk': 1,
             '_contrib_interleaved_matmul_selfatt_valatt': 2,
             '_contrib_interleaved_matmul_encdec_qk': 2,
             '_contrib_interleaved_matmul_encdec_valatt': 2, 'batch_dot': 2}
#: MARK value of the nodes that tie a library op's other inputs to its data's shape
#: (:data:`EXTRA_INPUTS`): ``_contrib_arange_like`` (LayerNorm) and ``BlockGrad`` of ``pick``
#: of a ``Cast`` of the lengths (softmax with lengths).
TIE = 'kernel_tie'
#: MXNet 1.9.1's attribute of a library op node naming how many of its last inputs are "extra":
#: MXNet's wrapper of library ops leaves them out of the library's shape and type inference
#: (lib_api.h's ``MX_STR_EXTRA_INPUTS``). The wrapper sizes its buffer of input shapes as the
#: sum of the inputs' numbers of axes, an unknown shape counting -1, and then writes every known
#: axis into it: any input of unknown shape beside one of known axes wrote past the buffer or
#: through a null pointer (a segmentation fault: ``mxmp_dropout`` without data's shape, whose
#: flag is (1,); softmax with 1-D data and lengths of unknown shape, or the reverse). So the
#: rule passes every input but data as an extra input: the wrapper sees data's shape alone, so
#: with data's shape unknown it fails cleanly (the buffer's size wraps to a huge one: "cannot
#: create std::vector larger than max_size()") and with it known it passes it whole. MXNet's
#: own ops give the extra inputs their shapes, as MXNet's LayerNorm and softmax would: gamma
#: and beta go through ``_identity_with_attr_like_rhs`` with ``_contrib_arange_like(data,
#: axis=-1)`` (both (D,)); the lengths are the index of a ``pick(data, length, axis=-1)``
#: (data's shape without its last axis), whose output (behind ``BlockGrad``: no gradient work)
#: the library op takes as one more extra input and ignores.
EXTRA_INPUTS = '__ext_extra_inputs__'


def _eligible(node, used_outputs):
    """Whether ``node`` (graph JSON) is one the rule replaces."""
    op, attrs = node['op'], node.get('attrs', {})
    if op not in SUBSTITUTES or len(node['inputs']) != _N_INPUTS[op]:
        return False
    if op == 'batch_dot':   # dense arrays (no forward_stype: sparse storage stays MXNet's)
        return attrs.get('forward_stype', 'None') in ('None', 'default')
    if op in ATTENTION:
        return 'heads' in attrs
    if op == 'LeakyReLU':
        return attrs.get('act_type') == 'gelu' and not used_outputs - {0}
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


def replaces(op, attrs):
    """Whether the rule replaces a node of ``op`` with ``attrs`` (dict; values as Python or as
    strings), its first output alone read: the conformance suite's ``library`` case."""
    node = {'op': op, 'attrs': {k: str(v) for k, v in attrs.items()},
            'inputs': [None] * _N_INPUTS.get(op, 0)}
    return op in SUBSTITUTES and _eligible(node, {0})


def _flag_nodes(names):
    """The training-mode flag (module docstring): a constant 1 and MXNet's Dropout of it."""
    one = {'op': '_ones', 'name': unique_name('mxmp_train_flag_one', names),
           'attrs': {'shape': '(1,)', 'dtype': 'float32', MARK: FLAG}, 'inputs': []}
    flag = {'op': 'Dropout', 'name': unique_name('mxmp_train_flag', names),
            'attrs': {'p': '0.5', 'mode': 'training', MARK: FLAG}, 'inputs': None}
    return one, flag


def _user_ops(policy):
    """Ops the user put in another class than the rule's library op: the float32 library ops
    leave the ops named in ``lp_ops`` or ``follow_ops``; the attention matmuls (low precision)
    leave those named in ``fp32_ops`` or ``follow_ops`` (an ``lp_ops`` name asks for what the
    library op does)."""
    attention = frozenset(ATTENTION)
    return ((frozenset(policy.lp_ops | policy.follow_ops) - attention) |
            (frozenset(policy.fp32_ops | policy.follow_ops) & attention))


def attention_pays():
    """bool: whether the library's attention matmuls replace MXNet's here: this CPU's tier
    (its flags and ``DNNL_MAX_CPU_ISA``) is ``avx512_bf16`` and it has the ``avx512_bf16``
    instructions: there their AVX512-BF16 GEMM runs (the library reads the same cap) and was
    measured faster than MXNet's float32 kernel."""
    from ..cpu_tier import _cpu_flags, cpu_tier
    return cpu_tier() == 'avx512_bf16' and 'avx512_bf16' in _cpu_flags()


def _chosen(js, kernels, skip_ops=frozenset(), attention=False, skip_names=frozenset()):
    """Positions of the nodes of ``js`` the rule replaces (structure only); the attention
    matmuls (:data:`ATTENTION`) only with ``attention``, and not those named in ``skip_names``
    (the policy's ``excluded_names``: float32)."""
    if not attention:
        skip_ops = frozenset(skip_ops) | frozenset(ATTENTION)
    if kernels not in ('auto', 'all'):
        raise ValueError("kernels must be 'auto' or 'all', got %r" % (kernels,))
    nodes = js['nodes']
    used = {}
    for node in nodes:
        for src, idx, _ in node['inputs']:
            used.setdefault(src, set()).add(idx)
    for src, idx, _ in js['heads']:
        used.setdefault(src, set()).add(idx)
    return {nid for nid, n in enumerate(nodes) if _eligible(n, used.get(nid, set()))
            and n['op'] not in skip_ops and (kernels == 'all' or n['op'] not in OPT_IN)
            and not (n['op'] in ATTENTION and n['name'] in skip_names)}


def _addto():
    return os.environ.get('MXNET_EXEC_ENABLE_ADDTO', '0') not in ('', '0')


#: Ops the MXNET_EXEC_ENABLE_ADDTO warning named already (it names each once per process).
_ADDTO_SAID = set()


def _warn_addto(ops):
    new = sorted(set(ops) - _ADDTO_SAID)
    if new:
        _ADDTO_SAID.update(new)
        logger.warning("mxmp: MXNET_EXEC_ENABLE_ADDTO is set: %s keep%s MXNet's kernel%s "
                       "(mxmp's library ops cannot add to a gradient in place; unset it for "
                       "mxmp's faster kernels)", ', '.join(
                           'softmax (with lengths)' if op == 'softmax' else op for op in new),
                       's' if len(new) == 1 else '', '' if len(new) == 1 else 's')


def substitute(js, policy):
    """``js`` (graph JSON) with the kernel rule applied (module docstring): a new dict, or
    ``js`` itself where nothing applies or the library is unavailable (built and loaded here
    on first use)."""
    if policy.kernels == 'mxnet' or policy.target_dtype != 'bfloat16':
        return js
    return apply_kernels(js, policy.kernels, _user_ops(policy), attention=attention_pays(),
                         skip_names=policy.excluded_names)


def planned(js, policy):
    """``{node name: library op}`` of the nodes :func:`substitute` would replace in ``js``,
    decided from the graph's structure and the environment alone: it never builds or loads
    the library (:func:`mxmp.explain`). Empty where the rule is off, including a library that
    already failed to load in this process."""
    from ..kernels.build import library_loaded
    if (policy.kernels == 'mxnet' or policy.target_dtype != 'bfloat16' or _addto() or
            os.environ.get('MXMP_KERNELS', '').lower() == 'mxnet' or library_loaded() is False):
        return {}
    nodes = js['nodes']
    return {nodes[nid]['name']: SUBSTITUTES[nodes[nid]['op']]
            for nid in _chosen(js, policy.kernels, _user_ops(policy), attention_pays(),
                               policy.excluded_names)}


def apply_kernels(js, kernels, skip_ops=frozenset(), attention=False, skip_names=frozenset()):
    """The rule's rewrite of ``js`` (graph JSON, dict) whatever its dtypes: ``kernels`` is
    ``'auto'`` (the default set) or ``'all'`` (also :data:`OPT_IN`); nodes of ``skip_ops``
    stay; the attention matmuls (:data:`ATTENTION`, bfloat16 products) only with
    ``attention`` (bool, default False), except the nodes named in ``skip_names``.
    :func:`substitute` calls it for bfloat16 targets; the transformer study calls it on a
    float32 graph to measure the library's kernels without the precision (``python -m
    benchmarks.gpt --kernels all``), where the attention matmuls stay float32. Returns a new
    dict, or ``js`` where nothing applies or the library is unavailable."""
    chosen = _chosen(js, kernels, skip_ops, attention, skip_names)
    if not chosen:
        return js
    nodes = js['nodes']
    if _addto():
        _warn_addto(nodes[nid]['op'] for nid in chosen)
        return js
    from ..kernels.build import load_library
    if load_library() is None:
        return js
    names = {n['name'] for n in nodes}
    out, new_id, flag = [], {}, None
    from . import selfatt_pair   # loaded by the first conversion, not by `import mxmp`
    pairs = selfatt_pair.selfatt_pairs(js, chosen)   # valatt -> qk
    emits = set(pairs.values())
    from . import ln_copy   # the LayerNorm copy: LayerNorm -> its second reader (node, input)
    copies = ln_copy.layer_norm_copies(js, chosen)
    rewired = {reader: ln for ln, reader in copies.items()}

    def add(op, name, node_inputs, attrs, mark):
        out.append({'op': op, 'name': unique_name(name, names), 'inputs': node_inputs,
                    'attrs': dict(attrs, **{MARK: mark})})
        return [len(out) - 1, 0, 0]

    for nid, node in enumerate(nodes):
        inputs = [[new_id[s], ln_copy.COPY if (nid, p) in rewired else i, v]
                  for p, (s, i, v) in enumerate(node['inputs'])]
        if nid in chosen:
            op, name = node['op'], node['name']
            if nid in pairs:   # the values the pair's qk emits: no copy (not a variable)
                inputs[0] = [new_id[pairs[nid]], 1, 0]
            elif nodes[node['inputs'][0][0]]['op'] == 'null':   # data: a copy of a variable
                inputs[0] = add('_copy', '%s_%s_copy' % (name, nodes[node['inputs'][0][0]][
                    'name']), [inputs[0]], {}, INPUT_COPY)
            data = inputs[0]
            if op in ATTENTION:   # every input is data: each variable through a copy
                for pos in range(1, len(inputs)):
                    if nodes[node['inputs'][pos][0]]['op'] == 'null':
                        inputs[pos] = add('_copy', '%s_%s_copy' % (name, nodes[node['inputs'][
                            pos][0]]['name']), [inputs[pos]], {}, INPUT_COPY)
            elif op == 'Dropout':
                if flag is None:
                    one, dropout = _flag_nodes(names)
                    out.append(one)
                    out.append(dict(dropout, inputs=[[len(out) - 1, 0, 0]]))
                    flag = [len(out) - 1, 0, 0]
                inputs.append(flag)
            elif op == 'LayerNorm':
                # gamma and beta: (D,) with D data's last axis, through MXNet's own ops; the
                # identity is also the copy whose backward honours grad_req='add'
                axis = add('_contrib_arange_like', name + '_mxmp_last_axis', [data],
                           {'axis': '-1'}, TIE)
                for pos in (1, 2):
                    inputs[pos] = add('_identity_with_attr_like_rhs', '%s_%s_copy' % (
                        name, nodes[node['inputs'][pos][0]]['name']), [inputs[pos], axis], {},
                        INPUT_COPY)
            elif op == 'softmax':   # lengths: their shape from pick's index (no copy:
                # integers; the Cast gives pick the index dtype it needs, whatever theirs is)
                index = add('Cast', name + '_mxmp_length_index', [inputs[1]],
                            {'dtype': 'int32'}, TIE)
                picked = add('pick', name + '_mxmp_length_shape', [data, index],
                             {'axis': '-1', 'mode': 'clip'}, TIE)
                inputs.append(add('BlockGrad', name + '_mxmp_length_tie', [picked], {}, TIE))
            attrs = dict(node.get('attrs', {}), **{MARK: KERNEL_PREFIX + op})
            if len(inputs) > 1 and op not in ATTENTION:   # attention: every input is data
                attrs[EXTRA_INPUTS] = str(len(inputs) - 1)
            if nid in emits:
                attrs[selfatt_pair.EMIT_V] = '1'
            elif nid in pairs:
                attrs[selfatt_pair.V_ONLY] = '1'
            if nid in copies:
                attrs[ln_copy.COPY_OUT] = '1'
            node = dict(node, op=SUBSTITUTES[op], attrs=attrs)
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
    return dict(js, nodes=out, heads=[[new_id[s], i, v] for s, i, v in js['heads']])


def _mark_parts(node):
    """``(original op, dtype or None)`` of a library node of the rule, else ``(None, None)``."""
    mark = node.get('attrs', {}).get(MARK, '') if node['op'] != 'null' else ''
    if not mark.startswith(KERNEL_PREFIX):
        return None, None
    op, _, dtype = mark[len(KERNEL_PREFIX):].partition(LOW_SUFFIX)
    return op, dtype or None


def kernel_dtype(node):
    """The low-precision dtype (str) the pass marked a library node with, or None."""
    return _mark_parts(node)[1]


def with_kernel_dtype(node, dtype):
    """``node`` (a library node) marked as running in ``dtype`` (str): a new dict."""
    mark = KERNEL_PREFIX + original_op(node) + LOW_SUFFIX + dtype
    return dict(node, attrs=dict(node['attrs'], **{MARK: mark}))


def restore(node):
    """The original form of a node the rule wrote: ``'input'`` for an added copy (it stands for
    its first input), ``'drop'`` for the flag's and the shape ties' nodes, a new node dict with
    the original op (and inputs), or None for other nodes. A self-attention pair's valatt
    comes back reading its qk's second output, which :func:`.kernel_undo.mxnet_ops` points at
    the qk's input again (:func:`.selfatt_pair.pair_source`); a LayerNorm copy's reader, the
    LayerNorm's output 3, which they point at output 0 (:func:`.ln_copy.has_copy`)."""
    if node['op'] == 'null':
        return None
    mark = node.get('attrs', {}).get(MARK, '')
    if mark in (INPUT_COPY, FLAG, TIE):
        return 'input' if mark == INPUT_COPY else 'drop'
    if not mark.startswith(KERNEL_PREFIX):
        return None
    attrs = {k: v for k, v in node['attrs'].items()
             if k not in (MARK, EXTRA_INPUTS, 'emit_v', 'v_only', 'copy_out')}
    op = original_op(node)
    new = dict(node, op=op, attrs=attrs, inputs=node['inputs'][:_N_INPUTS.get(op, 99)])
    if not attrs:
        new.pop('attrs')
    return new


def original_op(node):
    """The MXNet op a library node of the rule replaced (str), or None for other nodes."""
    return _mark_parts(node)[0]
