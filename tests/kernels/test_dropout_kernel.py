"""mxmp's library Dropout (``mxmp_dropout``) and the kernel rule that substitutes it.

Its mask is random, so it is checked against Dropout's definition, in a worker process
(tests/kernels/kernels_worker.py) on the real kernels and with ``DNNL_MAX_CPU_ISA=AVX2``: kept
values are x / (1 - p) (float32 error measured below 1.2e-7, float64 below 2e-16; bounds 5x),
the rest 0; the gradient is dy / (1 - p) where kept; the dropped fraction is within 5 binomial
standard deviations of p; flag 1 (inference) is the identity unless ``mode='always'``; a seed
gives the same mask, the next call another; neighbouring mask bits are uncorrelated
(|corr| below 5 / sqrt(n) for n = 2**20).
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
BOUND = {'float64': 1e-15, 'float32': 6e-7}


@pytest.fixture(scope='module', params=['native', 'AVX2'])
def results(request):
    env = dict(os.environ, OMP_NUM_THREADS='1')
    if request.param == 'AVX2':
        env['DNNL_MAX_CPU_ISA'] = 'AVX2'
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'kernels_worker.py'), 'dropout'],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_library
def test_mask_semantics_are_dropouts(results):
    assert len(results['rows']) == 12
    for row in results['rows']:
        p, n = row['p'], row['n']
        assert abs(row['dropped'] - p) <= 5 * (p * (1 - p) / n) ** 0.5, row
        assert row['kept_err'] <= BOUND[row['dtype']], row
        assert row['grad_err'] <= BOUND[row['dtype']], row
        assert row['inference_identity'], row
        if n > 100:
            assert row['always_drops'], row


@needs_library
def test_seeded_and_fresh_per_call(results):
    assert results['same_seed_same_mask']
    # two independent masks with p = 0.1 differ in 2 p (1 - p) = 18% of the elements
    assert abs(results['next_call_differs'] - 0.18) <= 5 * (0.18 * 0.82 / 2 ** 20) ** 0.5
    assert max(results['lag_corr']) <= 5 / 2 ** 10


@needs_library
def test_rule_in_a_converted_gluon_network(results):
    rule = results['rule']
    assert 'mxmp_dropout' in rule['ops'] and rule['ops'].count('Dropout') == 1  # the flag
    assert rule['inference_equal']   # outside autograd.record: identity, as MXNet's Dropout
    assert abs(rule['train_dropped'] - 0.3) <= 5 * (0.21 / rule['train_n']) ** 0.5
    assert rule['train_grad_finite']


@needs_library
def test_rule_adds_one_flag_and_remove_casts_undoes_it():
    data = mx.sym.var('data')
    h = mx.sym.Dropout(mx.sym.FullyConnected(data, num_hidden=8, name='fc'), p=0.1, name='d1')
    sym = mx.sym.Dropout(h, p=0.2, mode='always', name='d2')
    all_kernels = mxmp.Policy('bfloat16', kernels='all')
    conv = mxmp.convert_symbol(sym, policy=all_kernels)
    nodes = json.loads(conv.tojson(remove_amp_cast=False))['nodes']
    assert [n['op'] for n in nodes].count('mxmp_dropout') == 2
    assert [n['op'] for n in nodes].count('Dropout') == 1
    flag = [i for i, n in enumerate(nodes) if n['op'] == 'Dropout'][0]
    assert all(n['inputs'][1][0] == flag for n in nodes if n['op'] == 'mxmp_dropout')
    assert mxmp.remove_casts(conv).tojson() == sym.tojson()
    rows = {r.name: r.rule for r in mxmp.explain(sym, policy=all_kernels)}
    assert rows['d2'].startswith('kernel rule: Dropout as mxmp_dropout')
    # explain plans the user's graph (it never loads the library): the rule names the flag
    assert 'training-mode flag' in rows['d2'] and 'mxmp_train_flag' not in rows


@pytest.mark.parametrize('attrs', [dict(p=0.0), dict(p=0.5, axes=(1,))])
def test_rule_leaves_other_dropouts(attrs):
    sym = mx.sym.Dropout(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8), **attrs)
    ops = [n['op'] for n in json.loads(mxmp.convert_symbol(
        sym, policy=mxmp.Policy('bfloat16', kernels='all')).tojson())['nodes']]
    assert 'Dropout' in ops and 'mxmp_dropout' not in ops


@needs_library
def test_dropout_is_in_the_default_kernel_set():
    # in 'auto' since the transformer study traced its +1.2% perplexity to mask noise
    # (docs/accuracy.md); Policy(kernels='mxnet') keeps MXNet's Dropout
    sym = mx.sym.Dropout(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8), p=0.1)
    ops = [n['op'] for n in json.loads(mxmp.convert_symbol(sym, 'bfloat16').tojson())['nodes']]
    assert ops.count('mxmp_dropout') == 1 and ops.count('Dropout') == 1   # the flag
    ops = [n['op'] for n in json.loads(mxmp.convert_symbol(
        sym, policy=mxmp.Policy('bfloat16', kernels='mxnet')).tojson())['nodes']]
    assert 'Dropout' in ops and 'mxmp_dropout' not in ops
