"""Pieces of ``scripts/benchmark.py`` (the entry point): the machine's limit and where time goes.

* :mod:`benchmarks.flops` -- FLOP per image from a graph's Convolution/FullyConnected shapes.
* :mod:`benchmarks.peak` -- the GEMM peak of this machine (float32 and the target dtype) and
  the percent of it a row reaches.
* :mod:`benchmarks.profile` -- per-operator time from MXNet's profiler, side by side.
* :mod:`benchmarks.memory` -- peak RSS split into a fixed part and a part per image.
* :mod:`benchmarks.train_rss` -- peak RSS of a few training steps, one lever at a time.

Not part of the installed ``mxmp`` package.
"""
