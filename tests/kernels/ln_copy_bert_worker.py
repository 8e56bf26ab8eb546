#!/usr/bin/env python3
"""Worker of tests/kernels/test_ln_copy.py: trains the benchmark's bert_tiny converted to
bfloat16 for 3 SGD steps (momentum, mxmp.Trainer), once with the kernel rule's LayerNorm copy
and once without it (``ln_copy.layer_norm_copies`` answering none: the rule's graph before the
copy existed), from the same seeds, and prints one JSON line: the losses' and parameters' bits
after each run, the copies in the converted graph, and the ``add_n`` calls of one more forward
and backward (MXNet's profiler, aggregate statistics).

    python tests/kernels/ln_copy_bert_worker.py
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..'))
sys.path.insert(0, HERE)
import mxmp  # noqa: E402
from mxmp._src.graph import ln_copy  # noqa: E402
# the pair's worker trains bert_tiny and counts add_n the same way
from selfatt_pair_bert_worker import _train  # noqa: E402


def main():
    real = mxmp.converted_graph
    seen = {}

    def spy(net, *args, **kwargs):   # the converted graph _train reads: count the copies
        sym = real(net, *args, **kwargs)
        nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
        seen['copy_out'] = [n['name'] for n in nodes if n['op'] == 'mxmp_layer_norm' and
                            n.get('attrs', {}).get('copy_out') == '1']
        seen['layer_norms'] = sum(n['op'] == 'mxmp_layer_norm' for n in nodes)
        return sym

    mxmp.converted_graph = spy
    try:
        out = {'copy': dict(_train(True), **seen)}
        found = ln_copy.layer_norm_copies
        ln_copy.layer_norm_copies = lambda js, chosen: {}   # the rule without the copy
        try:
            out['no_copy'] = dict(_train(False), **seen)
        finally:
            ln_copy.layer_norm_copies = found
    finally:
        mxmp.converted_graph = real
    print(json.dumps(out))


if __name__ == '__main__':
    main()
