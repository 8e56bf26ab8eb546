"""mxmp's operator library: C++ kernels MXNet 1.9.1 loads at run time (``mx.library.load``),
built on first use with the system compiler (:mod:`.build`), and the graph rule that puts them
in place of MXNet's kernels (:mod:`mxmp._src.graph.kernel_rule`). docs/pass.md, "Kernel rule".
"""
