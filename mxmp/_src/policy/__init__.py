"""The precision policy: which dtype each operator computes in (re-exports only).

:mod:`.policy` holds :class:`Policy` and the class names; :mod:`.tables` merges
``ops_shared.py`` (ops whose class is the same for float16 and bfloat16) with ``ops_float16.py``
or ``ops_bfloat16.py`` (only the differences); :mod:`.coverage` holds the rules that leave
registered ops unclassified; :mod:`.kernel_report` the evidence file of ``mxmp check-kernels``
that :meth:`Policy.from_kernel_report` reads.
"""
