"""mxmp's GELU (``mxmp_gelu`` in mxmp/_src/kernels/mxmp_ops.cc; the kernel rule replaces
MXNet's ``LeakyReLU(act_type='gelu')``, mxmp/_src/graph/kernel_rule.py).

Pinned: the op against a float64 reference and against MXNet's float32 GELU, float32 and
bfloat16, forward and backward, on adversarial inputs (large |x|, +-inf, NaN, denormals, signed
zeros, the negative tail where MXNet's float32 1 + erf cancels); with the default policy (and
``Policy(kernels='all')``) a converted FFN block (Dense -> GELU -> Dense) runs ``mxmp_gelu`` in the Dense layers' dtype with
no cast around it (bfloat16 on real kernels; float32 held and rounded on the emulated tier), the
same casts as with MXNet's GELU, and output and gradients within bfloat16's error of float32's;
``Policy(kernels='mxnet')`` and a user's ``follow_ops`` keep MXNet's op; inference-only graphs (the oneDNN-fused twin,
``mxmp.freeze``) get MXNet's GELU back, in the library op's dtype, uncast, so that oneDNN folds
it into the FullyConnected; ``act_type='leaky'`` is left alone.

Tolerances (measured, Zen 4, seeds 0-4, real kernels and ``DNNL_MAX_CPU_ISA=AVX2``): float32
op against float64 at most 1.7e-7 of the largest magnitude forward and backward (bound 5e-7;
MXNet's float32 op: 1.4e-7, and NaN at +-inf where the limit is finite); bfloat16 within one
bfloat16 rounding of the float64 value of the rounded input plus the float32 kernel's absolute
error (bound 2**-8 relative + 2e-6, elementwise); the block as tests/kernels/test_bfloat16_library_ops.py (2e-2, 4e-2).
"""
import json
import math

import numpy as np
import pytest

import mxnet as mx
from mxnet import autograd
from mxnet.contrib.amp.amp import bfloat16

import mxmp
from mxmp._src.conformance.gelu import gelu_ref
from mxmp._src.graph.kernel_undo import inference_only
from mxmp._src.graph.symbol_json import load
from mxmp._src.kernels.build import OPS, load_library
from tier_run import needs_library

LIBRARY = load_library() is not None
REAL = mxmp.lp_kernels_available('bfloat16')
SPECIAL = [np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-45, 0.0, -0.0, 1e30, -1e30, 3e38, -3e38,
           16.0, -16.0, 13.2, -13.2, 87.0, -87.0]


def _inputs(seed):
    rng = np.random.RandomState(seed)
    x = np.concatenate([rng.normal(size=20000) * 3, rng.uniform(-14, -3, 2000),
                        np.linspace(-20, 20, 4001), SPECIAL]).astype(np.float32)
    return x, rng.normal(size=x.size).astype(np.float32)


def _grad_of(fn, x, head):
    x.attach_grad()
    with autograd.record():
        y = fn(x)
    y.backward(head)
    return y, x.grad


def _f32(a):
    return (a if a.dtype == np.float32 else mx.nd.amp_cast(a, dtype='float32')).asnumpy()


def _maxnorm(got, ref):
    fin = np.isfinite(ref)
    return np.abs(got[fin] - ref[fin]).max() / np.abs(ref[fin]).max()


@needs_library
@pytest.mark.parametrize('seed', [0, 1])
def test_float32_gelu_against_float64_and_mxnet(seed):
    assert 'mxmp_gelu' in OPS
    x, dy = _inputs(seed)
    ref_y, ref_g = gelu_ref(x, dy)
    y, g = _grad_of(mx.nd.mxmp_gelu, mx.nd.array(x), mx.nd.array(dy))
    my, mg = _grad_of(lambda a: mx.nd.LeakyReLU(a, act_type='gelu'), mx.nd.array(x),
                      mx.nd.array(dy))
    y, g, my, mg = y.asnumpy(), g.asnumpy(), my.asnumpy(), mg.asnumpy()
    assert y.dtype == g.dtype == np.float32
    # NaN exactly where the reference is NaN (x NaN; dy NaN), finite where it is finite
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref_y))
    np.testing.assert_array_equal(np.isnan(g), np.isnan(ref_g))
    assert _maxnorm(y, ref_y) <= 5e-7 and _maxnorm(g, ref_g) <= 5e-7
    fin = np.isfinite(x)
    # MXNet's float32 op agrees where it is finite...
    assert np.abs(y[fin] - my[fin]).max() <= 5e-7 * np.abs(ref_y[fin]).max()
    assert np.abs(g[fin] - mg[fin]).max() <= 5e-7 * np.abs(ref_g[fin]).max()
    # ...and gives NaN at -inf (forward) and +-inf (backward), where the limits are finite
    at = {v: x.size - len(SPECIAL) + i for i, v in enumerate(SPECIAL) if not np.isnan(v)}
    k = at[-np.inf]
    assert np.isnan(my[k]) and y[k] == 0 and np.signbit(y[k])
    assert g[at[np.inf]] == dy[at[np.inf]] and g[k] == 0 and np.isnan(mg[at[np.inf]])
    # denormal and zero inputs: x / 2 (Phi(0) = 1/2), the sign kept
    for v in (1e-40, -1e-40, 0.0):
        i = at[v]
        assert y[i] == x[i] / 2 and np.signbit(y[i]) == np.signbit(x[i])


@needs_library
def test_bfloat16_gelu_is_one_rounding_from_float64():
    x, dy = _inputs(2)
    xb = mx.nd.amp_cast(mx.nd.array(x), dtype=bfloat16)
    hb = mx.nd.amp_cast(mx.nd.array(dy), dtype=bfloat16)
    y, g = _grad_of(mx.nd.mxmp_gelu, xb, hb)
    assert y.dtype == bfloat16 and g.dtype == bfloat16
    ref_y, ref_g = gelu_ref(_f32(xb), _f32(hb))
    for got, ref in ((_f32(y), ref_y), (_f32(g), ref_g)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        fin = np.isfinite(ref)
        # one bfloat16 rounding, plus the float32 kernel's absolute error (Phi within 1.8e-7)
        assert (np.abs(got[fin] - ref[fin]) <= 2.0 ** -8 * np.abs(ref[fin]) + 2e-6).all()


def _ffn(act_type='gelu'):
    data = mx.sym.var('data')
    h = mx.sym.FullyConnected(data, num_hidden=64, flatten=False, name='ffn1')
    h = mx.sym.LeakyReLU(h, act_type=act_type, name='act')
    return mx.sym.FullyConnected(h, num_hidden=16, flatten=False, name='ffn2')


def _convert(sym, **kw):
    return mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', **kw))


def _nodes(sym):
    return json.loads(sym.tojson(remove_amp_cast=False))['nodes']


def _casts(sym):
    nodes = _nodes(sym)
    return sorted((n['attrs']['dtype'], nodes[n['inputs'][0][0]]['name']) for n in nodes
                  if n['op'] == 'amp_cast')


@needs_library
def test_a_converted_ffn_runs_the_library_gelu_with_no_cast_around_it():
    got = _convert(_ffn())
    nodes = _nodes(got)
    ops = [n['op'] for n in nodes]
    assert 'mxmp_gelu' in ops and 'LeakyReLU' not in ops
    # the casts of the Dense layers' data, weights and biases and the float32 output: the
    # same as with MXNet's GELU (bfloat16 in MXNet too); none reads or feeds the GELU
    want = sorted([('bfloat16', 'data'), ('float32', 'ffn2')] +
                  [('bfloat16', 'ffn%d_%s' % (i, p)) for i in (1, 2) for p in ('bias', 'weight')])
    assert _casts(got) == want == _casts(_convert(_ffn(), kernels='mxnet'))
    gelu = [i for i, n in enumerate(nodes) if n['op'] == 'mxmp_gelu'][0]
    assert nodes[nodes[gelu]['inputs'][0][0]]['op'] == 'FullyConnected'
    # its data's dtype where it runs: bfloat16 (the FullyConnected's output)
    internals = got.get_internals()
    _, types, _ = internals.infer_type(data='float32')
    dtypes = dict(zip(internals.list_outputs(), types))
    assert dtypes['act_output'] == bfloat16
    rows = {r.name: r for r in mxmp.explain(_ffn(), policy=mxmp.Policy('bfloat16'))}
    assert rows['act'].op == 'mxmp_gelu' and rows['act'].dtype == 'bfloat16'
    assert 'LeakyReLU as mxmp_gelu' in rows['act'].rule


@needs_library
def test_the_default_and_all_kernels_run_the_library_gelu():
    for sym in (_convert(_ffn()), _convert(_ffn(), kernels='auto'),
                _convert(_ffn(), kernels='all')):
        ops = [n['op'] for n in _nodes(sym)]
        assert 'mxmp_gelu' in ops and 'LeakyReLU' not in ops


@needs_library
def test_mxnet_kernels_follow_ops_and_leaky_keep_mxnets_op():
    for sym in (_convert(_ffn(), kernels='mxnet'),
                _convert(_ffn(), follow_ops=['LeakyReLU']), _convert(_ffn('leaky'))):
        ops = [n['op'] for n in _nodes(sym)]
        assert 'LeakyReLU' in ops and 'mxmp_gelu' not in ops


@needs_library
def test_inference_only_graphs_get_mxnets_gelu_back_uncast():
    js = load(_convert(_ffn()))
    back = inference_only(js)
    ops = [n['op'] for n in back['nodes']]
    assert 'LeakyReLU' in ops and 'mxmp_gelu' not in ops
    # no cast was added: oneDNN's fusion sees FullyConnected -> LeakyReLU(gelu), bfloat16
    assert sum(op == 'amp_cast' for op in ops) == sum(n['op'] == 'amp_cast' for n in js['nodes'])
    act = [n for n in back['nodes'] if n['op'] == 'LeakyReLU'][0]
    assert act['attrs']['act_type'] == 'gelu'
    assert back['nodes'][act['inputs'][0][0]]['op'] == 'FullyConnected'


@needs_library
@pytest.mark.parametrize('seed', [0, 1])
def test_converted_ffn_trains_within_bfloat16_error_of_float32(seed):
    rng = np.random.RandomState(seed)
    x = mx.nd.array(rng.normal(size=(4, 8, 32)))
    head = mx.nd.array(rng.normal(size=(4, 8, 16)))
    params = {'ffn1_weight': rng.normal(size=(64, 32)) / math.sqrt(32),
              'ffn1_bias': rng.normal(size=64) * 0.1,
              'ffn2_weight': rng.normal(size=(16, 64)) / math.sqrt(64),
              'ffn2_bias': rng.normal(size=16) * 0.1}
    results = []
    for sym in (_ffn(), mxmp.convert_symbol(_ffn(), policy=mxmp.Policy(
            'bfloat16', emulate=not REAL))):
        args = {k: mx.nd.array(v) for k, v in params.items()}
        args['data'] = x
        grads = {k: mx.nd.zeros(v.shape) for k, v in params.items()}
        exe = sym.bind(mx.cpu(), args, args_grad=grads)
        out = exe.forward(is_train=True)[0]
        exe.backward(head)
        assert 'mxmp_gelu' in sym.tojson() or not results
        results.append((_f32(out), grads['ffn1_weight'].asnumpy()))
    (ref, ref_g), (got, got_g) = results
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
    assert np.abs(got_g - ref_g).max() <= 4e-2 * np.abs(ref_g).max()


def test_conformance_runs_the_library_case_for_gelu_only():
    # `mxmp check-kernels` checks mxmp_gelu (kernels='all' included) against MXNet's GELU and
    # its numerical contract; LeakyReLU's other variants have no library op
    from mxmp._src.conformance.run import cases_of
    cases = cases_of('LeakyReLU')
    assert ('gelu', 'library') in cases and ('leaky', 'library') not in cases
    assert ('gelu', 'lp-input') in cases and ('leaky', 'lp-input') in cases
