"""A bucketed loop whose batches change sequence length on most steps (tests/amp/varlen_worker.py:
GluonNLP BERT, 2 layers, 64 units, one sequence of a random length in 1..32 per batch, 1,000
batches, ``mxmp.convert(net, 'bfloat16')``, hybridized with ``static_alloc``).

A new input shape does not rebuild mxmp's graph: MXNet's CachedOp keeps the one traced graph
and re-infers shapes, so the pass (and the fused inference twin) run once. What a new shape
costs is MXNet's own work (shape inference, memory, oneDNN primitives), measured on the Zen 5
machine (shared, one thread, lengths 1..512, 1,000 training batches, 446 distinct lengths):
median CPU seconds per training call on a new length / a seen one, float32 16.1 / 14.4 ms,
mxmp 19.1 / 17.3 ms. Memory grows with the number of distinct shapes in float32 too, because
MXNet 1.9.1 caches oneDNN primitives per shape without limit by default
(``MXNET_MKLDNN_CACHE_NUM=-1``); mxmp's casts and bfloat16 kernels are more primitives per shape:
RSS after 100 / 400 / 1,000 batches, float32 290 / 335 / 389 MiB, mxmp 323 / 456 / 572 MiB; with
``MXNET_MKLDNN_CACHE_NUM=64`` after 100 / 400, float32 285 / 297, mxmp 292 / 303 MiB
(docs/from_contrib_amp.md "Variable-length batches"). With a bounded set of lengths, as here,
RSS stops growing once every length has been seen: from batch 300 to 1,000 it moved 0.1-0.2 MiB
(seeds 0, 1, training and inference, float32 alike).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip('gluonnlp')
ROOT = Path(__file__).resolve().parents[2]


def worker(*args):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-m', 'tests.amp.varlen_worker', *args],
                          cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('args', [('--batches', '1000'), ('--batches', '600', '--infer')])
def test_new_lengths_reuse_the_one_graph_and_memory_plateaus(args):
    got = worker('convert', '--max-len', '32', *args)
    assert got['distinct'] == 32 and got['graphs'] == 1
    assert got['fused'] <= 1              # one fused twin where the real kernels run, else none
    rss = got['rss_mib']
    assert max(rss[3:]) - rss[2] < 4.0, rss     # measured 0.1-0.2 MiB after batch 300
