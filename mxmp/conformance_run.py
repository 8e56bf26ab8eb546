"""Old path: the conformance suite's processes moved to :mod:`mxmp.conformance.run`."""
from .conformance.run import EPS, _serve, tolerances  # noqa: F401
