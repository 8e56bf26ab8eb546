"""The per-layer numerics report of :func:`mxmp.diagnose` (docs/diagnose.md)."""
