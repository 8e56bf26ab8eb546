"""Run Sockeye 2.x's own training command with ``mxnet.contrib.amp`` replaced by ``mxmp.amp``.

    python -m tests.amp.sockeye_launcher DTYPE [sockeye.train arguments ...]

This is the one edit a user makes to Sockeye (``from mxnet.contrib import amp`` ->
``from mxmp import amp``, and ``amp.init()`` -> ``amp.init(target_dtype=DTYPE)``), done here
without touching Sockeye's files: ``mxnet.contrib.amp`` is ``mxmp.amp`` before Sockeye imports
it, and its ``init`` defaults to DTYPE. Everything else is Sockeye's ``sockeye.train.main``:
its ``--amp`` path calls ``amp.init()``, ``amp.init_trainer``, sets
``trainer._amp_loss_scaler._scale_seq_len``, ``amp.scale_loss`` each batch, and pickles and
restores ``_loss_scale``, ``_next_loss_scale``, ``_unskipped`` with its training state.
After training, one JSON line: the dtypes of the FullyConnected outputs of every graph mxmp
converted (``mxmp.converted_graph``), the attention matmuls in those graphs (op -> count), the
scaler fields the first ``scale_loss`` of the process
saw (after a resume: what Sockeye restored) and those at the end.
"""
import functools
import json
import sys

import mxnet as mx
import mxnet.contrib
import mxnet.contrib.amp.amp

import mxmp
from mxmp import amp

from mxnet.contrib.amp.amp import bfloat16 as BFLOAT16  # noqa: E402 (before the swap)


def fc_dtypes(sym, inputs):
    """{dtype name: count} of the FullyConnected outputs of a Symbol, ``inputs`` float32."""
    import numpy as np
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    fcs = {n['name'] + '_output' for n in nodes if n['op'] == 'FullyConnected'}
    internals = sym.get_internals()
    _, types, _ = internals.infer_type_partial(**{i.name: 'float32' for i in inputs})
    counts = {}
    for name, t in zip(internals.list_outputs(), types):
        if name in fcs:
            key = 'unknown' if t is None else \
                'bfloat16' if np.dtype(t) == np.dtype(BFLOAT16) else np.dtype(t).name
            counts[key] = counts.get(key, 0) + 1
    return counts


def main():
    dtype, argv = sys.argv[1], sys.argv[2:]
    amp.init = functools.partial(amp.init, target_dtype=dtype)
    mxnet.contrib.amp = amp      # what ``from mxnet.contrib import amp`` reads
    trainers = []
    original = amp.init_trainer

    def init_trainer(trainer):
        trainers.append(trainer)
        original(trainer)
    amp.init_trainer = init_trainer
    first = []                   # the fields the first scale_loss of this process used
    scale_loss = amp.scale_loss

    def scale_loss_recorded(loss, trainer):
        if not first:
            s = trainer._amp_loss_scaler
            first.append([s._loss_scale, s._next_loss_scale, s._unskipped])
        return scale_loss(loss, trainer)
    amp.scale_loss = scale_loss_recorded
    seen = []
    hybrid_call = mx.gluon.HybridBlock.__call__

    def call(block, *args):
        out = hybrid_call(block, *args)
        if block not in seen:
            seen.append(block)
        return out
    mx.gluon.HybridBlock.__call__ = call
    from sockeye import train
    train.main() if not argv else (sys.argv.__setitem__(slice(1, None), argv), train.main())
    graphs, attention = {}, {}
    for block in seen:
        try:
            sym = mxmp.converted_graph(block)
        except RuntimeError:
            continue
        for k, v in fc_dtypes(sym, block._cached_graph[0]).items():
            graphs[k] = graphs.get(k, 0) + v
        for node in json.loads(sym.tojson(remove_amp_cast=False))['nodes']:
            if 'interleaved_matmul' in node['op'] or node['op'] in (
                    'mxmp_encdec_qk', 'mxmp_encdec_valatt', 'mxmp_selfatt_qk',
                    'mxmp_selfatt_valatt', 'batch_dot', 'mxmp_batch_dot'):
                attention[node['op']] = attention.get(node['op'], 0) + 1
    s = trainers[0]._amp_loss_scaler if trainers else None
    print(json.dumps({'fc_dtypes': graphs, 'attention_ops': attention, 'first_step': first[0] if first else None,
                      'fields': None if s is None else [
        s._loss_scale, s._next_loss_scale, s._unskipped, s._scale_seq_len]}))


if __name__ == '__main__':
    main()
