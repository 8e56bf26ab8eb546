"""Kernel conformance suite: does every op the policy runs in low precision compute correctly here?

:func:`check_kernels` takes every op that a :class:`~mxmp.Policy` lets compute in the target
dtype (classes LOW_PRECISION, FOLLOW and WIDEST_TYPE; aliases share their canonical op's
kernel and are covered by it), builds a one-op graph at realistic sizes
(:mod:`mxmp._src.conformance.cases`), converts it with :func:`mxmp.convert_symbol`, runs it forward
and backward, and compares with the float32 graph run on the same rounded inputs and the same
rounded head gradients. Up to three cases per op and attribute variant:

``lp-input``  the op's float data arrives in the target dtype (from a low-precision producer:
              the converted graph's data inputs are declared low precision); weights and
              BatchNorm parameters arrive float32 and the pass casts them.
``cast``      every input arrives float32 and the pass casts it (``Policy(lp_ops=[op])`` for
              ops that are not LOW_PRECISION already): how weights arrive.
``lp-params`` the parameters (weights, biases, gamma, moving statistics) are graph variables
              stored in the target dtype (``__dtype__``, as after ``net.cast('bfloat16')``),
              the data arrives in it too, and the op is planned as the policy classes it (a
              float32 op stays float32): low-precision weights into float32 ops. Run for the
              variants with parameters, by default also for the ops outside the tested
              classes that have such a case (Deconvolution, LayerNorm, ...), in this case only.

Each op runs in its own Python subprocess, so a kernel that corrupts memory fails that op
only: a negative return code is reported as the signal (``crash(SIGABRT)``) with the last lines
MXNet or glibc wrote to stderr. MXNet 1.9.1's bfloat16 ``transpose`` is such an op.

Modes: ``real`` runs the converted graph as it is: with oneDNN's bfloat16 kernels where the CPU
has them (avx512_bf16, AMX), with MXNet's generic bfloat16 kernels (elementwise, shape, gather)
everywhere. ``emulated`` runs the emulated graph (float32 kernels, values rounded through the
target dtype, see :mod:`mxmp._src.graph`). By default (``emulate=None``) a case runs ``real`` and,
when the CPU lacks the oneDNN kernels, falls back to ``emulated`` where the real graph fails
with oneDNN's "could not create a primitive descriptor". float16 on a CPU is always emulated.

Error measure (per output or gradient, the worst one reported): ``max|y - y32| / max|y32|``
(``max|y|`` when the reference is all zero). Tolerances come from the dtype's machine epsilon
``eps`` (bfloat16 2^-7, float16 2^-10): forward ``eps`` (two unit roundoffs: the rounding of
the output and one of the op's own arithmetic), backward ``2 * eps`` (the head gradient is
rounded as well). On real avx512_bf16 kernels (AMD EPYC Zen 4, ``mxmp check-kernels``) the
correct ops measured forward <= 0.0032 and backward <= 0.005 against these 0.0078 and 0.0156.

Modules: :mod:`.check` (:func:`check_kernels`, the command), :mod:`.cases` (the one-op graphs),
:mod:`.run` (the zygote and the forked child that measures); the report they write,
:class:`KernelReport`, is in :mod:`mxmp._src.policy.kernel_report` (the policy reads it). This module
re-exports their public names.
"""
