"""mxmp's library softmax with lengths (``mxmp_softmax``) and the kernel rule that substitutes it
for ``softmax(data, length, use_length=True)`` (GluonNLP's masked attention).

Compared with MXNet's softmax with lengths in a worker process (tests/kernels/kernels_worker.py),
on the real kernels and with ``DNNL_MAX_CPU_ISA=AVX2``: shapes with rows of 7 to 1000, lengths
from 0 to the full row, seeds 0-2. Measured (Zen 4): float64 errors below 5e-14 against MXNet's
float64; the library's float32 below 4e-7 against float64 (relative to the largest value), as
close as MXNet's float32 or closer (within 2x + 1e-6). Bounds are 5x the spread.
"""
import json
import os
import subprocess
import sys

import pytest

import mxnet as mx
import mxmp
from tier_run import needs_library

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope='module', params=['native', 'AVX2'])
def rows(request):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    if request.param == 'AVX2':
        env['DNNL_MAX_CPU_ISA'] = 'AVX2'
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'kernels_worker.py'), 'softmax'],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])['rows']


@needs_library
def test_matches_mxnet_softmax_with_lengths(rows):
    assert len(rows) == 12
    for row in rows:
        assert max(row['float64']) <= 1e-12, row
        # float32 against float64 (the library sums rows in double: measured below 4e-7,
        # where MXNet's float32 gradient is up to 5.6e-5 off; so no bound against MXNet's)
        assert max(row['lib32_vs_64']) <= 2e-6, row
        for lib, ref in zip(row['lib32_vs_64'], row['mxnet32_vs_64']):
            assert lib <= 2 * ref + 1e-6, row
        assert row['beyond_length_zero'], row


def _attention(**attrs):
    score = mx.sym.batch_dot(mx.sym.var('q'), mx.sym.var('k'), transpose_b=True, name='qk')
    return mx.sym.softmax(score, length=mx.sym.var('valid_length'), name='sm', **attrs)


@needs_library
def test_rule_substitutes_softmax_with_lengths():
    sym = _attention(use_length=True, axis=-1)
    conv = mxmp.convert_symbol(sym, 'bfloat16', data_names=['q', 'k', 'valid_length'],
                               data_dtypes={'valid_length': 'int32'})
    nodes = json.loads(conv.tojson(remove_amp_cast=False))['nodes']
    sm = [n for n in nodes if n['name'] == 'sm'][0]
    assert sm['op'] == 'mxmp_softmax'
    assert nodes[sm['inputs'][1][0]]['name'] == 'valid_length'   # lengths never cast
    assert mxmp.remove_casts(conv).tojson() == sym.tojson()
    rows = {r.name: r for r in mxmp.explain(sym, 'bfloat16', data_dtypes={'valid_length':
                                                                          'int32'})}
    assert rows['sm'].rule.startswith('kernel rule: softmax as mxmp_softmax')


@pytest.mark.parametrize('attrs', [dict(axis=-1), dict(use_length=True, axis=1),
                                   dict(use_length=True, temperature=2.0)])
def test_rule_leaves_other_softmaxes(attrs):
    sym = _attention(**attrs) if attrs.get('use_length') else mx.sym.softmax(
        mx.sym.var('data'), **attrs)
    ops = [n['op'] for n in json.loads(mxmp.convert_symbol(
        sym, 'bfloat16', data_dtypes={'valid_length': 'int32'} if attrs.get('use_length')
        else None).tojson())['nodes']]
    assert 'softmax' in ops and 'mxmp_softmax' not in ops
