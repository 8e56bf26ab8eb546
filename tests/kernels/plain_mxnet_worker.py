#!/usr/bin/env python3
"""Worker of tests/kernels/test_artefacts.py: loads the files mxmp wrote in a fresh process
with plain MXNet (no mxmp import unless a case asks for it) and runs them.

    python tests/kernels/plain_mxnet_worker.py SPEC.json

SPEC: a list of cases ``{"name", "kind": "imports" | "checkpoint", "prefix", "epoch",
"inputs": {name: .npy path}, "import_mxmp": bool}``. Prints one JSON line: ``{name: {"out":
nested list} or {"error": message}}`` and ``"mxmp_imported"`` (whether any mxmp module was
imported: only cases with ``import_mxmp`` may do so).
"""
import json
import os
import sys

import numpy as np

import mxnet as mx
from mxnet import gluon


def _run(case):
    arrays = {n: np.load(p) for n, p in case['inputs'].items()}
    inputs = {n: mx.nd.array(a, dtype=a.dtype) for n, a in arrays.items()}
    names = list(case['inputs'])
    if case['kind'] == 'imports':
        block = gluon.SymbolBlock.imports('%s-symbol.json' % case['prefix'], names,
                                          '%s-%04d.params' % (case['prefix'], case['epoch']))
        out = block(*[inputs[n] for n in names])
    else:
        sym, args, aux = mx.model.load_checkpoint(case['prefix'], case['epoch'])
        mod = mx.mod.Module(sym, data_names=names, label_names=None, context=mx.cpu())
        mod.bind(data_shapes=[mx.io.DataDesc(n, inputs[n].shape, inputs[n].dtype)
                              for n in names], for_training=False)
        mod.set_params(args, aux)
        mod.forward(mx.io.DataBatch([inputs[n] for n in names]), is_train=False)
        out = mod.get_outputs()[0]
    out = out[0] if isinstance(out, (list, tuple)) else out
    return {'out': out.asnumpy().astype(np.float64).tolist()}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    results = {}
    for case in cases:
        if case.get('import_mxmp'):
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                                            '..'))
            import mxmp  # noqa: F401  (what the case checks: the import alone suffices)
        try:
            results[case['name']] = _run(case)
        except Exception as err:  # pylint: disable=broad-except  (reported to the test)
            results[case['name']] = {'error': str(err).strip().splitlines()[-1][:500]}
    results['mxmp_imported'] = any(m.split('.')[0] == 'mxmp' for m in sys.modules)
    print(json.dumps(results))


if __name__ == '__main__':
    main()
