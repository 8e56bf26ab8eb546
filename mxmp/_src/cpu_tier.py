"""Which bfloat16 tier this CPU is (:func:`cpu_tier`), how fast its bfloat16 matrix product runs
against float32 (:func:`gemm_speed_ratio`), and the once-per-process warning of a conversion whose
bfloat16 graph will run slower than float32 (:func:`warn_if_slower_than_float32`).

The tiers (MXNet 1.9.1's oneDNN v2.4.4; measured figures in README "Which dtype runs where"):

* ``'avx512_bf16'``: the CPU has ``avx512_bf16`` or ``amx_bf16``: oneDNN runs bfloat16
  Convolution and FullyConnected natively, faster than float32.
* ``'avx512_core'``: AVX-512 F/BW/VL/DQ without bfloat16 instructions (Intel Skylake-SP to
  Cascade Lake and Ice Lake servers): oneDNN emulates bfloat16 with float32 instructions,
  slower than float32 (:func:`mxmp.lp_kernels_available` is True, the numerics are those of the
  native tier).
* ``'avx2'``: no AVX-512 core (AVX2 or older CPUs): oneDNN has no bfloat16 kernels and mxmp
  emulates bfloat16 numerics with float32 kernels (``emulate=True``).

The tier is the lower of the CPU's flags (``/proc/cpuinfo``) and the cap of
``DNNL_MAX_CPU_ISA``, read as oneDNN v2.4.4 reads it: an exact, upper-case name (``AVX2``,
``AVX512_CORE``, ``AVX512_CORE_BF16``, ``ALL``...); any other value (``avx2`` in lower case,
surrounding spaces, an unknown name) is ignored by oneDNN and so here (measured with
``DNNL_VERBOSE=1``: its ``isa:`` line stays the CPU's own). oneDNN reads the variable when it
first runs a primitive, so it must be set before that, in practice before MXNet is imported.
"""
import functools
import os
import time
import warnings

from .errors import SlowerThanFloat32Warning

__all__ = ['TIERS', 'cpu_tier', 'describe', 'dnnl_isa_cap', 'gemm_speed_ratio', 'quiet',
           'tier_info', 'warn_if_slower_than_float32']

#: The tiers, fastest bfloat16 first.
TIERS = ('avx512_bf16', 'avx512_core', 'avx2')

#: DNNL_MAX_CPU_ISA values of oneDNN v2.4.4 -> the highest tier they allow (None: no cap).
_CAPS = {'SSE41': 'avx2', 'AVX': 'avx2', 'AVX2': 'avx2', 'AVX2_VNNI': 'avx2',
         'AVX512_MIC': 'avx2', 'AVX512_MIC_4OPS': 'avx2',
         'AVX512_CORE': 'avx512_core', 'AVX512_CORE_VNNI': 'avx512_core',
         'AVX512_CORE_BF16': None, 'AVX512_CORE_AMX': None, 'ALL': None}

_AVX512_CORE_FLAGS = ('avx512f', 'avx512bw', 'avx512vl', 'avx512dq')

#: What each tier means for a bfloat16 graph (printed by ``mxmp check-kernels``).
MEANING = {
    'avx512_bf16': 'oneDNN runs bfloat16 natively (avx512_bf16/AMX)',
    'avx512_core': 'AVX-512 without bfloat16 instructions: oneDNN emulates bfloat16, slower '
                   'than float32',
    'avx2': 'no AVX-512 core for oneDNN: it has no bfloat16 kernels, mxmp emulates bfloat16 '
            'numerics with float32 kernels (emulate=True)'}

_SAID = set()


def _cpu_flags():
    """set of str: the ``flags`` of /proc/cpuinfo's first processor (empty where unreadable)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return set(line.partition(':')[2].split())
    except OSError:
        pass
    return set()


def dnnl_isa_cap(environ=None):
    """The ``DNNL_MAX_CPU_ISA`` value oneDNN v2.4.4 obeys, or None (unset, ``ALL``, or a value it
    ignores: it matches the upper-case names exactly, module docstring).

    Args:
        environ (mapping): the environment; default ``os.environ``.

    Returns:
        str or None: one of the keys of ``_CAPS`` other than ``'ALL'``, or None.
    """
    value = (os.environ if environ is None else environ).get('DNNL_MAX_CPU_ISA')
    return value if value in _CAPS and value != 'ALL' else None


def cpu_tier(flags=None, environ=None):
    """This CPU's bfloat16 tier under the ``DNNL_MAX_CPU_ISA`` cap (module docstring).

    Args:
        flags (iterable of str): CPU flags; default those of ``/proc/cpuinfo`` (an unreadable
            file gives no flags: ``'avx2'``).
        environ (mapping): the environment; default ``os.environ``.

    Returns:
        str: ``'avx512_bf16'``, ``'avx512_core'`` or ``'avx2'`` (:data:`TIERS`).
    """
    flags = _cpu_flags() if flags is None else set(flags)
    if 'avx512_bf16' in flags or 'amx_bf16' in flags:
        tier = 'avx512_bf16'
    elif all(f in flags for f in _AVX512_CORE_FLAGS):
        tier = 'avx512_core'
    else:
        tier = 'avx2'
    cap = _CAPS.get(dnnl_isa_cap(environ))
    if cap is not None and TIERS.index(cap) > TIERS.index(tier):
        tier = cap
    return tier


@functools.lru_cache(maxsize=None)
def gemm_speed_ratio(size=1024, repeats=5):
    """bfloat16 matrix-product speed relative to float32 on this CPU: float32 time / bfloat16
    time of a ``size`` x ``size`` by ``size`` x ``size`` FullyConnected forward (MXNet's threads),
    best of ``repeats`` calls after one warm-up call each. Measured once per process and
    arguments (~1 s at 1024 on one core). Above 1: bfloat16 is faster.

    Args:
        size (int): the matrices' side, default 1024.
        repeats (int): timed calls per dtype, default 5.

    Returns:
        float or None: None where oneDNN has no bfloat16 FullyConnected here
        (:func:`mxmp.lp_kernels_available` is False: the ``'avx2'`` tier).
    """
    import numpy as np
    from mxnet import autograd, nd
    from .device import lp_kernels_available
    from .dtypes import mx_dtype
    if not lp_kernels_available('bfloat16'):
        return None
    best = {}
    # numpy's generator of its own: MXNet's random state (the user's seeds) is left alone
    values = nd.array(np.random.RandomState(0).uniform(-1, 1, (2, size, size)))
    with autograd.pause():
        for dtype in ('float32', 'bfloat16'):
            x = nd.amp_cast(values[0], dtype=mx_dtype(dtype))
            w = nd.amp_cast(values[1], dtype=mx_dtype(dtype))
            x.wait_to_read()
            w.wait_to_read()
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                nd.FullyConnected(x, w, num_hidden=size, no_bias=True).wait_to_read()
                times.append(time.perf_counter() - start)
            best[dtype] = min(times[1:])
    return best['float32'] / best['bfloat16']


def tier_info(target_dtype='bfloat16'):
    """dict: ``tier`` (:func:`cpu_tier`), ``dnnl_max_cpu_isa`` (the cap oneDNN obeys, or None)
    and, for bfloat16, ``bf16_gemm_speed`` (:func:`gemm_speed_ratio`, None without oneDNN's
    bfloat16 kernels): what ``mxmp check-kernels`` records in its report and prints."""
    info = {'tier': cpu_tier(), 'dnnl_max_cpu_isa': dnnl_isa_cap()}
    if target_dtype == 'bfloat16':
        info['bf16_gemm_speed'] = gemm_speed_ratio()
    return info


def describe(info):
    """str: the lines of :func:`tier_info`'s dict ``info`` (a report's machine) for a person."""
    cap = info.get('dnnl_max_cpu_isa')
    lines = ['CPU tier: %s%s (%s)' % (info['tier'], ', DNNL_MAX_CPU_ISA=%s' % cap if cap else '',
                                      MEANING[info['tier']])]
    if 'bf16_gemm_speed' in info:
        ratio = info['bf16_gemm_speed']
        lines.append('bfloat16 matrix product (1024x1024 FullyConnected, best of 5): %.2fx the '
                     'speed of float32' % ratio if ratio is not None else
                     'bfloat16 matrix product: none on this CPU (float32 kernels when emulated)')
    return '\n'.join(lines)


def warn_if_slower_than_float32(target_dtype, emulate):
    """Warn (:class:`mxmp.SlowerThanFloat32Warning`, once per process) that a graph converted to
    ``target_dtype`` will run slower than float32: bfloat16 on real kernels (``emulate`` False)
    on the ``'avx512_core'`` tier, where oneDNN emulates bfloat16. The message names the tier,
    the measured :func:`gemm_speed_ratio` and what to do.

    Args:
        target_dtype (str): the conversion's target dtype.
        emulate (bool): whether the graph emulates the target dtype with float32 kernels.
    """
    if target_dtype != 'bfloat16' or emulate or 'slower' in _SAID:
        return
    tier = cpu_tier()
    if tier != 'avx512_core':
        return
    _SAID.add('slower')
    try:
        ratio = gemm_speed_ratio()
    except Exception:   # pylint: disable=broad-except  (a warning must not fail a conversion)
        ratio = None
    measured = ('a 1024x1024 bfloat16 matrix product ran at %.2fx the speed of float32 here'
                % ratio if ratio is not None else 'the speed ratio could not be measured')
    cap = dnnl_isa_cap()
    warnings.warn(SlowerThanFloat32Warning(
        'mxmp: this CPU is tier avx512_core (AVX-512 without bfloat16 instructions%s): oneDNN '
        'emulates bfloat16 Convolution and FullyConnected, and %s, so this bfloat16 graph will '
        'run slower than float32 (with the same numerics as on an avx512_bf16 CPU). For speed '
        'keep float32 on this CPU, or run on a CPU with avx512_bf16 or AMX; `mxmp check-kernels` '
        'prints the tier and the ratio.'
        % (', DNNL_MAX_CPU_ISA=%s' % cap if cap else '', measured)), stacklevel=3)


def quiet():
    """Mark the warning of :func:`warn_if_slower_than_float32` as given in this process (the
    check-kernels children, which convert one-op graphs by the hundred)."""
    _SAID.add('slower')
