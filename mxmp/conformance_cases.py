"""Old path: the conformance suite's input specs moved to :mod:`mxmp.conformance.cases`."""
from .conformance.cases import BTF, CASES, NCHW, NOT_TESTED  # noqa: F401
