"""scripts/test.sh's emulated rerun (EMULATED_PATH_TESTS, DNNL_MAX_CPU_ISA=AVX2 on a CPU with the
bfloat16 kernels) lists every test file whose path depends on the kernels, so a machine with
avx512_bf16 also tests the path an AVX2 CPU takes. Files left out say why here."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: file -> why it is not rerun with DNNL_MAX_CPU_ISA=AVX2
LEFT_OUT = {
    'tests/device/test_cpu_tier.py': 'runs its own processes under each DNNL_MAX_CPU_ISA cap',
    'tests/device/test_gpu.py': 'GPU tests: skipped without a GPU either way',
    'tests/conformance/test_real_kernels.py': 'real_kernels only: skipped under the cap',
    'tests/examples/test_train_imagenet_example.py': 'end-to-end runs of minutes; the full '
    'suite runs them on AVX2 CPUs',
    'tests/examples/test_train_imagenet_module_example.py': 'the same',
    'tests/examples/test_accuracy_transformer_study.py': 'the same',
    'tests/test_benchmark.py': 'benchmark subprocesses of minutes; the same',
    'tests/gluon/test_fused_accuracy.py': 'trains for 200 steps (214 s under DNNL_MAX_CPU_ISA=AVX2 '
    'on a loaded 2-core machine); the same',
    'tests/test_benchmark_transformer.py': 'report formatting of a synthetic report',
    'tests/graph/test_rules_and_user_policy.py': 'names lp_kernels_available only to answer '
    'for a GPU context; its CPU paths do not depend on the kernels',
    'tests/test_attention_routes.py': 'only its bfloat16 Convolution route depends on the '
    'kernels, and it skips without them; the float32 routes run in the main pass',
}


def rerun_list():
    text = (ROOT / 'scripts' / 'test.sh').read_text()
    body = re.search(r'EMULATED_PATH_TESTS=\(([^)]*)\)', text).group(1)
    return set(body.split())


def test_every_kernel_dependent_test_file_is_rerun_emulated_or_says_why():
    listed = rerun_list()
    assert all((ROOT / f).is_file() for f in listed), sorted(f for f in listed
                                                             if not (ROOT / f).is_file())
    dependent = {str(p.relative_to(ROOT)) for p in (ROOT / 'tests').rglob('test_*.py')
                 if re.search(r'lp_kernels_available|\bEMULATE\b', p.read_text())}
    dependent.discard('tests/test_emulated_rerun.py')
    missing = sorted(dependent - listed - set(LEFT_OUT))
    assert not missing, 'add to EMULATED_PATH_TESTS in scripts/test.sh or to LEFT_OUT: %s' \
        % missing
