"""benchmarks.attention_routes: MXNet's interleaved attention matmuls equal their float32
reshape/transpose/batch_dot form, forward and backward; MXNet 1.9.1 has no bfloat16 batched
product on CPU; the grouped-Convolution route and mxmp's library ops (the route the kernel rule
takes) compute the same block within bfloat16 rounding."""
import numpy as np
import pytest


def _grad_check(f_mxnet, f_ours, inputs, seed):
    """Output and input gradients of both functions on the same inputs and output gradient."""
    import mxnet as mx
    results = []
    for f in (f_mxnet, f_ours):
        xs = [x.copy() for x in inputs]
        for x in xs:
            x.attach_grad()
        with mx.autograd.record():
            y = f(*xs)
        og = mx.nd.array(np.random.RandomState(seed + 100).normal(size=y.shape))
        y.backward(og)
        results.append([y.asnumpy()] + [x.grad.asnumpy() for x in xs])
    return results


def _close(got, want, head_dim):
    # head dim 64: the scale 1/8 is exact, both compute the same float32 products in the same
    # order (measured: bit for bit); otherwise the scale rounds once more than in MXNet's GEMM
    if head_dim == 64:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def _same_op(f_mxnet, f_ours, inputs, seed, shape, head_dim):
    """The route ``f_ours`` gives MXNet's op ``f_mxnet``'s output (of ``shape``) and input
    gradients (``head_dim``: the scale's, 64 where the op has none)."""
    want, got = _grad_check(f_mxnet, f_ours, inputs, seed)
    assert want[0].shape == shape
    for w, g in zip(want, got):
        _close(g, w, head_dim)


@pytest.mark.parametrize('seq,batch,heads,head_dim,seed', [(7, 3, 2, 64, 0), (5, 2, 3, 10, 1)])
def test_selfatt_ops_are_batch_dot_of_heads_first_layout(seq, batch, heads, head_dim, seed):
    import mxnet as mx
    from benchmarks import attention_routes as routes
    rng = np.random.RandomState(seed)
    qkv = mx.nd.array(rng.normal(size=(seq, batch, 3 * heads * head_dim)))
    att = mx.nd.array(rng.uniform(size=(batch * heads, seq, seq)))
    _same_op(lambda x: mx.nd.contrib.interleaved_matmul_selfatt_qk(x, heads=heads),
             lambda x: routes.selfatt_qk(x, heads), [qkv], seed,
             (batch * heads, seq, seq), head_dim)
    _same_op(lambda x, a: mx.nd.contrib.interleaved_matmul_selfatt_valatt(x, a, heads=heads),
             lambda x, a: routes.selfatt_valatt(x, a, heads), [qkv, att], seed,
             (seq, batch, heads * head_dim), 64)   # no scale in valatt


@pytest.mark.parametrize('seq_q,seq_k,batch,heads,head_dim,seed',
                         [(6, 9, 3, 2, 64, 0), (4, 5, 2, 3, 10, 1)])
def test_encdec_ops_are_batch_dot_of_heads_first_layout(seq_q, seq_k, batch, heads, head_dim,
                                                        seed):
    import mxnet as mx
    from benchmarks import attention_routes as routes
    rng = np.random.RandomState(seed)
    q = mx.nd.array(rng.normal(size=(seq_q, batch, heads * head_dim)))
    kv = mx.nd.array(rng.normal(size=(seq_k, batch, 2 * heads * head_dim)))
    att = mx.nd.array(rng.uniform(size=(batch * heads, seq_q, seq_k)))
    _same_op(lambda a, b: mx.nd.contrib.interleaved_matmul_encdec_qk(a, b, heads=heads),
             lambda a, b: routes.encdec_qk(a, b, heads), [q, kv], seed,
             (batch * heads, seq_q, seq_k), head_dim)
    _same_op(lambda a, b: mx.nd.contrib.interleaved_matmul_encdec_valatt(a, b, heads=heads),
             lambda a, b: routes.encdec_valatt(a, b, heads), [kv, att], seed,
             (seq_q, batch, heads * head_dim), 64)   # no scale in valatt


def test_mxnet_has_no_bfloat16_batched_product_on_cpu():
    # Why mxmp keeps the attention products in float32: should a later MXNet run one of these,
    # the graph rule the script describes becomes worth building.
    from benchmarks.attention_routes import bfloat16_batched_products
    got = bfloat16_batched_products()
    assert set(got) == {'batch_dot', 'dot', 'linalg.gemm2', 'np.matmul', 'np.einsum'}
    assert 'dot only supports float32/float64 for CPU' in got['batch_dot']
    assert 'ok' not in got.values(), got


# Relative max-norm error of the bfloat16 grouped-Convolution block against the float32
# interleaved block on the same bfloat16-representable inputs (seq 16, batch 2, 3 heads, head
# dim 16), seeds 0-4, avx512_bf16: output 0.0036-0.0056, input gradient 0.0030-0.0054 (the
# scores and the softmax output are rounded to bfloat16). Bound 2x the largest. Real kernels
# only: without them oneDNN has no bfloat16 Convolution ("could not create a primitive
# descriptor iterator" under DNNL_MAX_CPU_ISA=AVX2).
CONV_TOL = 0.012


def _route_within_bfloat16_rounding(route, seed):
    """``route`` (a function of the interleaved bfloat16 input) against MXNet's interleaved
    block in float32 on the same bfloat16 inputs: output and input gradient within CONV_TOL."""
    import mxnet as mx
    from mxnet.contrib.amp.amp import bfloat16
    from benchmarks import attention_routes as routes
    heads = 3
    rng = np.random.RandomState(seed)
    x = mx.nd.amp_cast(mx.nd.array(rng.normal(size=(16, 2, 3 * heads * 16))), dtype=bfloat16)
    g = mx.nd.amp_cast(mx.nd.array(rng.normal(size=(16, 2, heads * 16))), dtype=bfloat16)
    x32, g32 = (mx.nd.amp_cast(a, dtype='float32') for a in (x, g))
    out, grad, _ = routes.time_block(lambda a: route(a, heads), x, g, 1)
    ref_out, ref_grad, _ = routes.time_block(
        lambda a: routes.interleaved_attention(a, heads, False), x32, g32, 1)
    assert out.shape == ref_out.shape == (16, 2, heads * 16)
    assert np.abs(out - ref_out).max() <= CONV_TOL * np.abs(ref_out).max()
    assert np.abs(grad - ref_grad).max() <= CONV_TOL * np.abs(ref_grad).max()


@pytest.mark.parametrize('seed', [0, 1])
def test_conv_route_matches_the_interleaved_block_within_bfloat16_rounding(seed):
    import mxmp
    if not mxmp.lp_kernels_available('bfloat16'):
        pytest.skip('no bfloat16 Convolution kernel on this CPU (emulated tier)')
    from benchmarks import attention_routes as routes
    _route_within_bfloat16_rounding(routes.conv_attention, seed)


# The library route (mxmp_selfatt_qk/valatt in bfloat16, the softmax in float32) on the same
# inputs and shapes: measured (seeds 0-4, Zen 4) output 0.0036-0.0056, input gradient
# 0.0030-0.0054, as the grouped-Convolution route (both round the scores and probabilities to
# bfloat16). Its kernels run on every tier (the portable path under the AVX2 cap).
@pytest.mark.parametrize('seed', [0, 1])
def test_library_route_matches_the_interleaved_block_within_bfloat16_rounding(seed):
    from benchmarks import attention_routes as routes
    from mxmp._src.kernels.build import load_library
    if load_library() is None:
        pytest.skip("mxmp's operator library does not build here")
    _route_within_bfloat16_rounding(routes.library_attention, seed)
