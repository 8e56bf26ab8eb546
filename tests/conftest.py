"""Suite-wide pytest hooks: tests marked ``real_kernels`` skip, with the reason, on a CPU
without oneDNN's bfloat16 kernels (AVX2 only, or oneDNN capped with ``DNNL_MAX_CPU_ISA=AVX2``).

The probe (:func:`mxmp.lp_kernels_available`) runs once, in this process, at collection time
and only if a collected test carries the marker.
"""
import os

import pytest


def real_kernels_skip_reason():
    """None when this process has oneDNN bfloat16 kernels, else why not (pytest's reason)."""
    import mxmp
    if mxmp.lp_kernels_available('bfloat16'):
        return None
    isa = os.environ.get('DNNL_MAX_CPU_ISA')
    return ('needs oneDNN bfloat16 kernels (avx512_bf16/AMX): mxmp.lp_kernels_available'
            '("bfloat16") is False here%s' % (' (DNNL_MAX_CPU_ISA=%s)' % isa if isa else ''))


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker('real_kernels')]
    if not marked:
        return
    reason = real_kernels_skip_reason()
    if reason is None:
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def amp_switch_off():
    """mxmp.amp.init is process-wide: no test leaves it on for the next one."""
    yield
    import mxmp
    mxmp.amp.disable()
