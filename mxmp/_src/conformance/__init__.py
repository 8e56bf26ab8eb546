"""The kernel conformance suite behind :func:`mxmp.check_kernels` (docs/conformance.md)."""
