"""Training on several devices and workers: gradient exchange (wire dtypes, buffers, bytes),
the root-rank broadcast of initial weights, MXNet's kvstore and Horovod.

The public names are re-exported by :mod:`mxmp` (``mxmp._src.horovod`` stays importable).
"""
