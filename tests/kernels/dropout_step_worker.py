"""Worker of tests/kernels/test_dropout_in_training.py: mxmp's library Dropout inside real
training steps of a small GPT (benchmarks/gpt.py's model), hybridized with static_alloc and
static_shape as the transformer study runs it.

    python tests/kernels/dropout_step_worker.py [SEED]     # MXNet's seed, default 7

The kernel rule's float32 graph (``kernel_rule.apply_kernels(..., 'all')``) gets every
``mxmp_dropout``'s seeds output as an extra head, so each training step shows the masks its
forward drew (recomputed from the seeds by the contract's numpy hash,
``mxmp._src.conformance.dropout``). The same step is then run on a reference graph in which
each Dropout is written out as ``x * mask / (1 - p)`` with those masks as inputs (no random
numbers): the loss and every parameter gradient must agree, which checks that the forward
applied the mask it returned and that the backward used the same one. An SGD update follows
each step (as in training). The same
steps through ``mxmp.convert_symbol(..., kernels='all')`` in bfloat16 show whether a seed gives
the same masks in float32 and bfloat16 (the study's pairing). Runs in its own process (a kernel
under test could crash the interpreter) and prints one JSON line.
"""
import json
import os
import sys

import numpy as np

import mxnet as mx
from mxnet import autograd, gluon

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')
sys.path.insert(0, ROOT)
import mxmp  # noqa: E402
from benchmarks.gpt import build_gpt, causal_mask  # noqa: E402
from mxmp._src.conformance.dropout import dropout_keep  # noqa: E402
from mxmp._src.graph.kernel_rule import apply_kernels  # noqa: E402
from mxmp._src.graph.symbol_json import dump, load  # noqa: E402
from mxmp._src.kernels.build import load_library  # noqa: E402

VOCAB, UNITS, LAYERS, HEADS, CONTEXT, BATCH, P = 11, 16, 2, 2, 8, 4, 0.3
STEPS = 3


def _with_seed_heads(graph):
    """``graph`` (after the rule) with output 1 (the seeds) of every mxmp_dropout as a head;
    returns (graph, [(data shape, p)] of those mxmp_dropouts)."""
    ids = [i for i, n in enumerate(graph['nodes']) if n['op'] == 'mxmp_dropout']
    internals = dump(graph).get_internals()
    shapes = dict(zip(internals.list_outputs(), internals.infer_shape_partial(
        tokens=(CONTEXT, BATCH), mask=(CONTEXT, CONTEXT))[1]))
    specs = [(tuple(shapes[graph['nodes'][i]['name'] + '_output0']),
              float(graph['nodes'][i]['attrs']['p'])) for i in ids]
    return dict(graph, heads=graph['heads'] + [[i, 1, 0] for i in ids]), specs


def _explicit_masks(graph):
    """``graph`` (float32, MXNet's Dropout) with each Dropout as x * mask_k / (1 - p), mask_k
    a new input; returns (graph, mask input names)."""
    out, new_id, names = [], {}, []
    for nid, node in enumerate(graph['nodes']):
        inputs = [[new_id[s], i, v] for s, i, v in node['inputs']]
        if node['op'] == 'Dropout':
            p = float(node['attrs']['p'])
            names.append('dropmask%d' % len(names))
            out.append({'op': 'null', 'name': names[-1], 'inputs': []})
            out.append({'op': 'elemwise_mul', 'name': node['name'] + '_mul',
                        'inputs': [inputs[0], [len(out) - 1, 0, 0]]})
            node = {'op': '_mul_scalar', 'name': node['name'] + '_scale',
                    'attrs': {'scalar': repr(1.0 / (1.0 - p))}, 'inputs': [[len(out) - 1, 0, 0]]}
            inputs = node['inputs']
        out.append(dict(node, inputs=inputs))
        new_id[nid] = len(out) - 1
    heads = [[new_id[s], i, v] for s, i, v in graph['heads']]
    arg_nodes = [i for i, n in enumerate(out) if n['op'] == 'null']
    return dict(graph, nodes=out, heads=heads, arg_nodes=arg_nodes,
                node_row_ptr=list(range(len(out) + 1))), names


def _rel(a, b):
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max())


def _train(block, params, batches, mask, specs=(), extra=None):
    """STEPS SGD steps of ``block`` (its extra outputs: the seeds of the mxmp_dropouts of
    ``specs``, as :func:`_with_seed_heads`); per step (loss, {param: grad}, [masks])."""
    trainer = gluon.Trainer(params, 'sgd', {'learning_rate': 0.5})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(axis=-1)
    steps = []
    for k, (x, y) in enumerate(batches):
        args = [x, mask] + ([mx.nd.array(m, dtype='float32') for m in extra[k]] if extra else [])
        with autograd.record():
            outs = block(*args)
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            loss = loss_fn(outs[0].astype('float32'), y).mean()
        loss.backward()
        masks = [dropout_keep(o.asnumpy(), shape, p).astype(np.uint8)
                 for o, (shape, p) in zip(outs[1:1 + len(specs)], specs)]
        grads = {name: p.grad().asnumpy().astype(np.float64) for name, p in params.items()
                 if p.grad_req != 'null'}
        steps.append((float(loss.asscalar()), grads, masks))
        trainer.step(1)
    return steps


def main(seed=7):
    if load_library() is None:
        return {'library': None}
    rng = np.random.RandomState(0)
    batches = [(mx.nd.array(rng.randint(0, VOCAB, size=(CONTEXT, BATCH))),
                mx.nd.array(rng.randint(0, VOCAB, size=(CONTEXT, BATCH))))
               for _ in range(STEPS)]
    mask = mx.nd.array(causal_mask(CONTEXT))
    mx.random.seed(seed)
    net = build_gpt(VOCAB, UNITS, LAYERS, HEADS, CONTEXT, P)
    net.initialize(mx.init.Normal(0.2))
    params = net.collect_params()
    start = {name: p.data().copy() for name, p in params.items()}
    inputs = [mx.sym.var('tokens'), mx.sym.var('mask')]
    plain = load(net(*inputs))

    def fresh(graph, names=()):
        for name, p in params.items():
            p.set_data(start[name])
        block = gluon.SymbolBlock(dump(graph), inputs + [mx.sym.var(n) for n in names],
                                  params=params)
        block.hybridize(static_alloc=True, static_shape=True)
        return block

    lib_graph, specs = _with_seed_heads(apply_kernels(plain, 'all'))
    mx.random.seed(seed)
    lib = _train(fresh(lib_graph), params, batches, mask, specs)
    with autograd.predict_mode():
        infer_lib = fresh(lib_graph)(batches[0][0], mask)[0].asnumpy()
        infer_ref = fresh(plain)(batches[0][0], mask).asnumpy()
    ref_graph, names = _explicit_masks(plain)
    masks = [[m.astype(np.float32) for m in masks] for _, _, masks in lib]
    ref = _train(fresh(ref_graph, names), params, batches, mask, extra=masks)
    # emulated where oneDNN has no bfloat16 kernels (an AVX2 CPU, DNNL_MAX_CPU_ISA=AVX2): the
    # Symbol API has no context to resolve emulate='auto' against
    emulate = not mxmp.lp_kernels_available('bfloat16')
    conv = mxmp.convert_symbol(dump(plain), policy=mxmp.Policy('bfloat16', kernels='all',
                                                               emulate=emulate),
                               data_names=['tokens', 'mask'])
    bf16_graph, bf16_specs = _with_seed_heads(load(conv))
    mx.random.seed(seed)
    bf16 = _train(fresh(bf16_graph), params, batches, mask, bf16_specs)
    all_masks = [m for _, _, ms in lib for m in ms]
    return {
        'n_masks': len(specs), 'n_dropout': len(names), 'mask_shapes': [m.shape for m in lib[0][2]],
        'dropped': [[float(1 - m.mean()) for m in ms] for _, _, ms in lib],
        'mask_sizes': [int(m.size) for m in lib[0][2]],
        'loss_err': [abs(a[0] - b[0]) / abs(b[0]) for a, b in zip(lib, ref)],
        'grad_err': [max(_rel(a[1][k], b[1][k]) for k in b[1]) for a, b in zip(lib, ref)],
        # the same layer in consecutive steps, and same-shape layers within a step
        'step_differs': [float((a != b).mean()) for s in range(STEPS - 1)
                         for a, b in zip(lib[s][2], lib[s + 1][2])],
        'layer_differs': [float((a != b).mean()) for i, a in enumerate(all_masks)
                          for b in all_masks[i + 1:] if a.shape == b.shape],
        'inference_err': _rel(infer_lib, infer_ref),
        'bf16_masks_equal': [bool((a == b).all()) for (_, _, ma), (_, _, mb) in zip(lib, bf16)
                             for a, b in zip(ma, mb)],
        'bf16_loss_rel': [abs(a[0] - b[0]) / abs(a[0]) for a, b in zip(lib, bf16)],
        'bf16_emulated': emulate,
        'bf16_mxmp_dropout': len(bf16_specs),
    }


if __name__ == '__main__':
    print(json.dumps(main(*map(int, sys.argv[1:]))))
