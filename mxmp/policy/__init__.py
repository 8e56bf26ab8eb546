"""The precision policy: which dtype each operator computes in (re-exports only).

:mod:`.policy` holds :class:`Policy` and the class names; :mod:`.tables` merges
``ops_shared.py`` (ops whose class is the same for float16 and bfloat16) with ``ops_float16.py``
or ``ops_bfloat16.py`` (only the differences); :mod:`.coverage` holds the rules that leave
registered ops unclassified; :mod:`.kernel_report` the evidence file of ``mxmp check-kernels``
that :meth:`Policy.from_kernel_report` reads.
"""
from ..dtypes import TARGET_DTYPES, normalize_dtype
from ..errors import AmpListConflict
from .policy import (FLOAT32, FOLLOW, LOSS_OUTPUT, LOW_PRECISION, WIDEST_TYPE, Policy,
                     _warn_unlisted)

__all__ = ['Policy', 'AmpListConflict', 'normalize_dtype', 'TARGET_DTYPES', 'LOW_PRECISION',
           'FLOAT32', 'LOSS_OUTPUT', 'WIDEST_TYPE', 'FOLLOW']
