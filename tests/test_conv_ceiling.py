"""benchmarks/conv_ceiling.py: its DNNL_VERBOSE parsing and per-layer arithmetic, on a
hand-written log (the measurement itself needs the real kernels and minutes: docs/benchmark.md
"ResNet-50's bfloat16 convolutions, layer by layer")."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.conv_ceiling import conv_of, gemm_of, parse, report  # noqa: E402

CONV = ('dnnl_verbose,exec,cpu,convolution,brgconv_1x1:avx512_core_bf16,forward_inference,'
        'src_bf16::blocked:acdb:f0 wei_bf16::blocked:AcdB64a2b:f0,{post},'
        'alg:convolution_direct,mb16_ic64oc256_ih56oh56kh1sh1dh0ph0_iw56ow56kw1sw1dw0pw0,{ms}')
GEMM = ('dnnl_verbose,exec,cpu,inner_product,x64:gemm:jit,forward_inference,'
        'src_bf16::blocked:ab:f0,,,mb{m}ic{k}oc{n},{ms}')
POOL = ('dnnl_verbose,exec,cpu,pooling_v2,jit:avx512_core_bf16,forward_inference,'
        'src_bf16::blocked:acdb:f0,,,mb16ic64_ih112oh56,{ms}')


def log(calls=2):
    lines = ['dnnl_verbose,info,oneDNN v2.4.4']
    for i in range(calls):
        lines += ['== net %d' % i, CONV.format(post='attr-post-ops:eltwise_relu:0:1 ', ms=4 + i),
                  CONV.format(post='attr-post-ops:sum+eltwise_relu:0:1 ', ms=10 - i),
                  POOL.format(ms=3), '== wall net %d %.6f' % (i, 0.020 - i * 0.001)]
    for m, k, n in ((50176, 64, 256), (2048, 2048, 2048)):
        for i in range(calls):
            ms = 8.0 if m == 50176 else 2 * 2048 ** 3 / 400e9 * 1e3   # the peak: 400 GFLOP/s
            lines += ['== gemm %d_%d_%d %d' % (m, k, n, i), GEMM.format(m=m, k=k, n=n, ms=ms),
                      '== wall gemm %d_%d_%d %d %.6f' % (m, k, n, i, ms / 1e3)]
    return lines


def test_descriptor_gives_the_convolution_and_its_gemm():
    desc = 'mb16_ic64oc256_ih56oh28kh1sh2dh0ph0_iw56ow28kw1sw2dw0pw0'
    assert conv_of(desc) == (16, 64, 256, 28, 28, 1, 1, 2)
    assert gemm_of(desc) == (16 * 28 * 28, 64, 256)
    with pytest.raises(ValueError, match='unexpected'):
        conv_of('mb16_g32ic64oc64_ih56oh56kh3sh1_iw56ow56kw3sw1')   # grouped: not handled


def test_report_takes_the_best_call_per_layer_against_the_peak():
    sections, walls = parse(log())
    assert [r[2] for r in sections['net 0']] == ['eltwise_relu', 'sum+eltwise_relu', '-']
    text = report(sections, walls, calls=2)
    flop = 2.0 * 16 * 56 * 56 * 64 * 256   # 1.644 GFLOP
    relu_pct = round(100 * flop / 4e-3 / 400e9)   # best of 4 and 5 ms
    sum_pct = round(100 * flop / 9e-3 / 400e9)    # best of 10 and 9 ms
    gemm_pct = round(100 * flop / 8e-3 / 400e9)
    assert 'peak (2048^3 bfloat16 FullyConnected): 400.0 GFLOP/s' in text
    assert '| 0 | 1x1 64->256 56x56 s1 | brgconv_1x1 | eltwise_relu | 1.644 | 4.00 | %d%% |' \
        % relu_pct in text
    assert '| 1 | 1x1 64->256 56x56 s1 | brgconv_1x1 | sum+eltwise_relu | 1.644 | 9.00 | %d%% |' \
        % sum_pct in text
    assert '(50176, 64, 256) 8.00 | %d%% |' % gemm_pct in text
    assert 'Fastest whole call (wall) 19.0 ms' in text
    assert '- convolution: 14.0 ms' in text   # the fastest call's own layers (5 + 9)
    assert "outside oneDNN (MXNet's own ops, engine, Python): 2.0 ms" in text
