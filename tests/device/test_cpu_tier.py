"""mxmp/_src/cpu_tier.py: the CPU's bfloat16 tier from its flags and oneDNN's DNNL_MAX_CPU_ISA
cap, against what oneDNN itself does under each cap (its DNNL_VERBOSE ``isa:`` line and
mxmp.lp_kernels_available), and the once-per-process warning that bfloat16 will run slower
than float32 on the avx512_core tier (tests/device/cpu_tier_worker.py, one process per cap)."""
import json
import os
import subprocess
import sys

import pytest

from mxmp._src.cpu_tier import cpu_tier, dnnl_isa_cap

HERE = os.path.dirname(os.path.abspath(__file__))
ZEN4 = {'avx2', 'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_bf16'}
SKYLAKE_SP = {'avx2', 'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512cd'}
SAPPHIRE_RAPIDS = SKYLAKE_SP | {'amx_bf16', 'amx_tile'}
ZEN3 = {'avx', 'avx2', 'fma'}


@pytest.mark.parametrize('flags, cap, tier', [
    (ZEN4, None, 'avx512_bf16'),
    (SAPPHIRE_RAPIDS, None, 'avx512_bf16'),
    (SKYLAKE_SP, None, 'avx512_core'),
    (ZEN3, None, 'avx2'),
    ({'avx2', 'avx512f'}, None, 'avx2'),               # Knights Landing: no AVX-512 BW/VL/DQ
    (ZEN4, 'AVX512_CORE', 'avx512_core'),
    (ZEN4, 'AVX512_CORE_VNNI', 'avx512_core'),
    (ZEN4, 'AVX2', 'avx2'),
    (ZEN4, 'SSE41', 'avx2'),
    (ZEN4, 'AVX512_CORE_BF16', 'avx512_bf16'),
    (ZEN4, 'ALL', 'avx512_bf16'),
    (SKYLAKE_SP, 'AVX512_CORE_AMX', 'avx512_core'),   # a cap never adds instructions
    (ZEN3, 'AVX512_CORE', 'avx2'),
    # oneDNN v2.4.4 matches the names exactly: it ignores these (measured with DNNL_VERBOSE)
    (ZEN4, 'avx2', 'avx512_bf16'),
    (ZEN4, 'Avx512_Core', 'avx512_bf16'),
    (ZEN4, ' AVX2', 'avx512_bf16'),
    (ZEN4, 'AVX3', 'avx512_bf16'),
])
def test_tier_of_flags_and_cap(flags, cap, tier):
    environ = {} if cap is None else {'DNNL_MAX_CPU_ISA': cap}
    assert cpu_tier(flags, environ) == tier
    assert dnnl_isa_cap(environ) == (cap if cap in ('AVX512_CORE', 'AVX512_CORE_VNNI', 'AVX2',
                                                    'SSE41', 'AVX512_CORE_BF16',
                                                    'AVX512_CORE_AMX') else None)


def _run(cap):
    env = dict(os.environ, DNNL_VERBOSE='1', OMP_NUM_THREADS='1')
    env.pop('DNNL_MAX_CPU_ISA', None)
    if cap is not None:
        env['DNNL_MAX_CPU_ISA'] = cap
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'cpu_tier_worker.py')],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    isa = [line for line in lines if line.startswith('dnnl_verbose,info,cpu,isa:')]
    return json.loads(lines[-1]), isa[0] if isa else ''


CPU = cpu_tier(environ={})


@pytest.mark.parametrize('cap', [None, 'AVX512_CORE', 'AVX2', 'avx2'])
def test_tier_agrees_with_onednn_and_the_warning_follows_it(cap):
    if cap == 'AVX512_CORE' and CPU == 'avx2':
        pytest.skip('an AVX2 CPU: the avx512_core tier needs AVX-512 (cpu_tier is %s)' % CPU)
    out, isa = _run(cap)
    assert out['tier'] == cpu_tier(environ={} if cap is None else {'DNNL_MAX_CPU_ISA': cap})
    # oneDNN's own view of the cap: bfloat16 instructions named in its isa line exactly on the
    # native tier; its bfloat16 kernels exist on every tier but avx2
    assert isa and ('bfloat16' in isa) == (out['tier'] == 'avx512_bf16'), isa
    assert out['kernels'] == (out['tier'] != 'avx2'), (out, isa)
    assert out['after_emulated'] == 0        # emulation runs float32 kernels: no warning
    if out['tier'] == 'avx512_core':
        # three real conversions, one warning, naming the tier, the cap and a measured ratio
        assert len(out['warnings']) == 1, out['warnings']
        message = out['warnings'][0]
        assert 'tier avx512_core' in message
        # the cap is named where it made the tier (a Cascade Lake CPU is avx512_core uncapped)
        assert ('DNNL_MAX_CPU_ISA=AVX512_CORE' in message) == (cap == 'AVX512_CORE')
        assert 'x the speed of float32' in message and 'mxmp check-kernels' in message
    else:
        assert out['warnings'] == []
