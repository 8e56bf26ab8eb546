"""glibc's malloc tuned for bfloat16 training on oneDNN's kernels (:func:`tune_malloc`), once per
process, with an opt-out (``MXMP_MALLOC=default``).

Why (docs/benchmark.md, "Why the bfloat16 FullyConnected backward runs 1.77x, not 1.98x"):
MXNet 1.9.1 builds the oneDNN FullyConnected backward primitives on every call, and in bfloat16
each allocates a scratchpad of float32 accumulators (2.25-12 MiB for BERT-base's layers): about
740 MiB of allocations of at least 1 MiB per BERT-base backward pass (float32: 162 MiB). With
glibc's defaults the arena serving MXNet's engine thread trims its heap when they are freed and
maps it again on the next call, so in about half the processes every step faults and zeroes
tens of thousands of fresh pages (about 5% of a step). Two of glibc's malloc parameters stop
that: allocations below 32 MiB come from the heap (``M_MMAP_THRESHOLD``), and the heap is not
trimmed unless 2 GiB are free at its top (``M_TRIM_THRESHOLD``). That is what the environment
variables ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296`` do (``mallopt``
takes a C int, so 2 GiB - 1 stands for 4 GiB: a secondary arena's heap is at most 64 MiB, and
either value means "never" for these allocations); ``mallopt`` sets the same fields of glibc's
parameters, which malloc reads at each allocation (mmap or heap) and free (trim or not), so
setting them after start-up acts from then on (the per-step fault counts of docs/benchmark.md
show it). It lowers the odds of the refaulting, not to zero: tuned processes fell into it too,
less often (docs/benchmark.md). Cost: freed heap memory is kept for reuse
rather than returned to the system (BERT-base's peak RSS grew by about 1%).
"""
import ctypes
import logging
import os

__all__ = ['MMAP_THRESHOLD', 'TRIM_THRESHOLD', 'MALLOC_VALUES', 'glibc', 'tune_malloc',
           'tune_for_conversion']

logger = logging.getLogger('mxmp.malloc')

#: bytes: allocations at least this large are served by mmap (glibc's default: 128 KiB, rising
#: with freed mmapped chunks up to 32 MiB).
MMAP_THRESHOLD = 32 << 20
#: bytes: free memory at the top of a heap above which glibc returns it to the system (glibc's
#: default: 128 KiB, rising to twice the mmap threshold); the largest value of mallopt's int.
TRIM_THRESHOLD = 2 ** 31 - 1
#: ``mallopt`` parameter numbers of glibc's <malloc.h>.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Accepted values of ``MXMP_MALLOC`` (case-insensitive; unset or empty means ``'tuned'``).
MALLOC_VALUES = ('tuned', 'default')
#: glibc's own ways to set the two parameters: where the user set one, their choice wins.
_USER_VARIABLES = ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_')
_USER_TUNABLES = ('glibc.malloc.mmap_threshold', 'glibc.malloc.trim_threshold')

_STATE = {}   # 'outcome': 'tuned' or why not, once decided in this process


def _requested():
    """str: ``MXMP_MALLOC`` read (``'tuned'`` where unset or empty).

    Raises:
        ValueError: any other value than those of :data:`MALLOC_VALUES`.
    """
    value = os.environ.get('MXMP_MALLOC', '').strip().lower() or 'tuned'
    if value not in MALLOC_VALUES:
        raise ValueError(
            'MXMP_MALLOC=%r: use %s (or leave it unset: mxmp tunes glibc\'s malloc for bfloat16 '
            'on oneDNN\'s kernels; \'default\' keeps glibc\'s defaults)'
            % (os.environ['MXMP_MALLOC'], ' or '.join(repr(v) for v in MALLOC_VALUES)))
    return value


def _why_not():
    """str or None: why the process keeps glibc's malloc as it is (None: tune it)."""
    if _requested() == 'default':
        return 'MXMP_MALLOC=default'
    user = [v for v in _USER_VARIABLES if v in os.environ]
    tunables = os.environ.get('GLIBC_TUNABLES', '')
    user += ['GLIBC_TUNABLES ' + t for t in _USER_TUNABLES if t in tunables]
    if user:
        return 'the environment sets %s (the user\'s choice wins)' % ', '.join(user)
    return None


def glibc():
    """ctypes.CDLL or None: the process's C library where it is glibc (it has
    ``gnu_get_libc_version``, and so ``mallopt`` and ``malloc_trim``), else None (musl, macOS,
    Windows). Also what :func:`mxmp.freeze` calls ``malloc_trim`` through."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version   # AttributeError where the C library is not glibc
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def tune_malloc():
    """Set glibc's ``M_MMAP_THRESHOLD`` to :data:`MMAP_THRESHOLD` (32 MiB) and
    ``M_TRIM_THRESHOLD`` to :data:`TRIM_THRESHOLD` (2 GiB - 1 byte) through ``mallopt``, once
    per process (process-wide: every thread's arena), and say so in one info line of the
    ``mxmp.malloc`` logger. Why: the module's docstring.

    Does nothing (and says why at debug level) where ``MXMP_MALLOC=default`` (the opt-out),
    where the environment sets ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or either
    in ``GLIBC_TUNABLES`` (the user's choice wins), where the C library is not glibc, or where
    ``mallopt`` refuses a value. Decided once: later calls return the first answer.

    Returns:
        str: ``'tuned'``, or the reason the process's malloc was left as it is.

    Raises:
        ValueError: ``MXMP_MALLOC`` is neither unset, empty, ``'tuned'`` nor ``'default'``
            (checked on every call, so a typo is not silently ignored).
    """
    why = _why_not()
    if 'outcome' in _STATE:
        return _STATE['outcome']
    libc = None if why else glibc()
    if why is None and libc is None:
        why = 'the C library is not glibc'
    if why is None:
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        if not (libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
            why = 'glibc\'s mallopt refused M_MMAP_THRESHOLD=%d or M_TRIM_THRESHOLD=%d' % (
                MMAP_THRESHOLD, TRIM_THRESHOLD)
    _STATE['outcome'] = why or 'tuned'
    if why:
        logger.debug('mxmp: glibc\'s malloc left as it is: %s', why)
    else:
        logger.info(
            'mxmp: glibc\'s malloc tuned for bfloat16 on oneDNN\'s kernels: M_MMAP_THRESHOLD=32 '
            'MiB, M_TRIM_THRESHOLD=%d bytes (MXNet\'s oneDNN FullyConnected backward allocates '
            'its bfloat16 scratchpads on every call; with glibc\'s defaults the heap is trimmed '
            'and refaulted every step). MXMP_MALLOC=default in the environment keeps glibc\'s '
            'defaults.', TRIM_THRESHOLD)
    return _STATE['outcome']


def tune_for_conversion(target_dtype, emulate):
    """:func:`tune_malloc` for a conversion to ``target_dtype`` that runs on oneDNN's bfloat16
    kernels on the CPU: ``target_dtype`` is ``'bfloat16'``, ``emulate`` is False and
    :func:`mxmp.lp_kernels_available` says the CPU has the kernels (True on the avx512_bf16
    tier and on the avx512_core tier, where oneDNN emulates bfloat16 and allocates the same
    scratchpads). Other conversions (float32, float16, emulated bfloat16) change nothing, but
    a bad ``MXMP_MALLOC`` raises for them too.

    Args:
        target_dtype (str): the conversion's target dtype (``'float32'``, ``'float16'`` or
            ``'bfloat16'``).
        emulate (bool): whether the graph emulates the target dtype with float32 kernels
            (a resolved ``Policy.emulate``).

    Returns:
        str or None: :func:`tune_malloc`'s answer, None where the conversion does not call it.

    Raises:
        ValueError: a bad ``MXMP_MALLOC`` (:func:`tune_malloc`).
    """
    _requested()
    if target_dtype != 'bfloat16' or emulate:
        return None
    from .device import lp_kernels_available
    if not lp_kernels_available('bfloat16'):
        return None
    return tune_malloc()
