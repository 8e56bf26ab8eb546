#!/usr/bin/env python3
"""Worker of tests/kernels/test_selfatt_pair.py: trains the benchmark's bert_tiny converted to
bfloat16 for 3 SGD steps (momentum, mxmp.Trainer), once with the kernel rule's self-attention
pair and once without it (``selfatt_pair.selfatt_pairs`` answering no pair: the rule's graph
before the pair existed), from the same seeds, and prints one JSON line: the losses and
parameters' bits after each run, the pair's nodes in the converted graph, and the ``add_n``
calls of one more forward and backward (MXNet's profiler, aggregate statistics).

    python tests/kernels/selfatt_pair_bert_worker.py
"""
import hashlib
import json
import os
import sys

import numpy as np

import mxnet as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import mxmp  # noqa: E402
from mxmp._src.graph import kernel_rule, selfatt_pair  # noqa: E402

BATCH, SEQ = 4, 16


def _add_n_calls(fn):
    """Calls of add_n (ElementWiseSum) while ``fn()`` runs, from MXNet's profiler."""
    from benchmarks.profile import parse_aggregate
    import tempfile   # MXNet's profiler writes its trace file there, not into the cwd
    mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                           filename=os.path.join(tempfile.mkdtemp(), 'profile.json'))
    mx.profiler.set_state('run')
    fn()
    mx.nd.waitall()
    mx.profiler.set_state('stop')
    text = mx.profiler.dumps(reset=True)
    sections = parse_aggregate(text)
    return sum(row['count'] for name, row in sections.get('operator', {}).items()
               if name in ('add_n', 'ElementWiseSum'))


def _train(pair):
    from benchmarks.bert import DATA_NAMES, bert_inputs, bert_labels, build_bert
    assert DATA_NAMES
    mx.random.seed(0)
    rng = np.random.RandomState(0)
    net = build_bert('bert_tiny')
    net.initialize(mx.init.Normal(0.02))
    net.hybridize(static_alloc=True)
    net = mxmp.convert(net, 'bfloat16')
    trainer = mxmp.Trainer(net.collect_params(), 'sgd',
                           {'learning_rate': 0.1, 'momentum': 0.9})
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    xs = bert_inputs(mx, 'bert_tiny', BATCH, SEQ, mx.cpu(), rng)
    y = bert_labels(mx, BATCH, mx.cpu(), rng)
    losses = []
    for _ in range(3):
        with mx.autograd.record():
            loss = loss_fn(net(*xs), y)
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
        trainer.step(BATCH)
        losses.append(loss.asnumpy().astype(np.float32).view(np.uint32).tolist())

    def step():
        with mx.autograd.record():
            loss = loss_fn(net(*xs), y)
        loss.backward()

    calls = _add_n_calls(step)
    # in the block's order (a second network's names carry other numbers)
    params = [hashlib.md5(p.data().asnumpy().tobytes()).hexdigest()
              for p in net.collect_params().values()]
    nodes = json.loads(mxmp.converted_graph(net).tojson(remove_amp_cast=False))['nodes']
    emit = [n['name'] for n in nodes if n['op'] == 'mxmp_selfatt_qk' and
            n.get('attrs', {}).get('emit_v') == '1']
    v_only = [n['name'] for n in nodes if n['op'] == 'mxmp_selfatt_valatt' and
              n.get('attrs', {}).get('v_only') == '1']
    return {'losses': losses, 'params': params, 'add_n_calls': calls, 'emit_v': emit,
            'v_only': v_only,
            'qk': sum(n['op'] == 'mxmp_selfatt_qk' for n in nodes)}


def main():
    out = {'pair': _train(True)}
    real = selfatt_pair.selfatt_pairs
    selfatt_pair.selfatt_pairs = lambda js, chosen: {}   # the rule without the pair
    try:
        out['no_pair'] = _train(False)
    finally:
        selfatt_pair.selfatt_pairs = real
    out['attention_pays'] = kernel_rule.attention_pays()
    print(json.dumps(out))


if __name__ == '__main__':
    main()
