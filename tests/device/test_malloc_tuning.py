"""mxmp tunes glibc's malloc for bfloat16 on oneDNN's kernels (mxmp/_src/malloc_tuning.py): once
per process, from every conversion entry point (Gluon ``mxmp.convert``, ``mxmp.Module``,
``mxmp.amp``), never for float16, emulated bfloat16 (no ``mxmp.lp_kernels_available``, e.g.
``DNNL_MAX_CPU_ISA=AVX2``) or float32 with mxmp's kernels, nor under ``MXMP_MALLOC=default`` or
glibc tunables the user set.

Each case runs tests/device/malloc_worker.py in a fresh process (the tuning is process-wide) and
reads glibc's observable effect: whether a 24 MiB malloc is served by mmap (``mallinfo2().hblkhd``):
24 MiB with glibc's defaults (even after ``import mxnet``), 0 once the mmap threshold is 32 MiB.
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _run(scenario, **env):
    """The worker's JSON answer for ``scenario`` under the environment plus ``env``."""
    full = {k: v for k, v in os.environ.items()
            if k not in ('MXMP_MALLOC', 'MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_')}
    full.update(env, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'malloc_worker.py'), scenario],
                          env=full, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _info(out):
    return [message for level, message in out['records'] if level == 'INFO']


def _assert_untuned(out):
    assert out['error'] is None
    assert out['mmapped_mib'] == 24, out
    assert _info(out) == [], out


def test_glibc_serves_24_mib_by_mmap_without_tuning():
    # the observable the other tests read: without mxmp's tuning, after `import mxnet, mxmp`
    _assert_untuned(_run('none'))


@pytest.mark.parametrize('scenario', ['gluon', 'module', 'amp'])
def test_bfloat16_conversion_tunes_where_the_kernels_are_real(scenario):
    out = _run(scenario)
    if not out['kernels']:   # emulated bfloat16 (AVX2 tier): glibc's defaults stay
        _assert_untuned(out)
        return
    assert out['error'] is None
    assert out['mmapped_mib'] == 0, out
    (line,) = _info(out)
    assert 'M_MMAP_THRESHOLD=32 MiB' in line and 'M_TRIM_THRESHOLD=2147483647' in line
    assert 'scratchpads' in line and 'MXMP_MALLOC=default' in line


def test_three_entry_points_log_the_tuning_once():
    out = _run('three')
    assert len(_info(out)) == (1 if out['kernels'] else 0), out


@pytest.mark.parametrize('scenario', ['float16', 'emulated', 'float32_kernels'])
def test_other_conversions_keep_glibcs_defaults(scenario):
    _assert_untuned(_run(scenario))


def test_mxmp_malloc_default_opts_out():
    out = _run('gluon', MXMP_MALLOC='Default')
    _assert_untuned(out)
    if out['kernels']:
        assert ['DEBUG', "mxmp: glibc's malloc left as it is: MXMP_MALLOC=default"] \
            in out['records']


def test_the_users_glibc_variable_wins():
    # MALLOC_TRIM_THRESHOLD_ alone also fixes glibc's mmap threshold at 128 KiB: 24 MiB mmapped
    out = _run('gluon', MALLOC_TRIM_THRESHOLD_='268435456')
    _assert_untuned(out)
    if out['kernels']:
        assert any('MALLOC_TRIM_THRESHOLD_' in message and 'wins' in message
                   for level, message in out['records'] if level == 'DEBUG'), out


@pytest.mark.parametrize('scenario', ['gluon', 'float16'])
def test_a_bad_mxmp_malloc_value_is_an_error_naming_the_accepted_ones(scenario):
    out = _run(scenario, MXMP_MALLOC='off')
    assert out['error'] is not None and "MXMP_MALLOC='off'" in out['error'], out
    assert "'tuned' or 'default'" in out['error']
    assert out['mmapped_mib'] == 24 and _info(out) == []
