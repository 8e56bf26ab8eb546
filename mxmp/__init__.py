"""mxmp: mixed-precision (float16 / bfloat16) training and inference for Apache MXNet 1.x.

This module is the public API, the names of the README's API table. :mod:`mxmp.amp`
(``mxnet.contrib.amp``'s API), :mod:`mxmp.horovod` and the ``mxmp`` command (:mod:`mxmp.cli`)
are public too. Everything under ``mxmp._src`` is internal: importable, not API.

The training and conversion names load with ``import mxmp``; the tools (:func:`diagnose`,
:func:`check_kernels`, :func:`check_alignment`, :func:`plot_run`), :class:`Module` and
:mod:`mxmp.amp` load on first use.
"""
import importlib

# First, before anything imports mxnet: with mxnet-cu112 installed (or MXMP_PRELOAD_CUDA=1),
# make the CUDA 11 libraries of the nvidia-*-cu11 wheels visible to it.
from ._src import cuda as _cuda
_cuda.preload_if_needed()

# pylint: disable=wrong-import-position
from ._src.cuda import CudaLibrariesNotFound, missing_cuda_libraries, preload_cuda_libraries  # noqa: E402,E501
from ._src.device import lp_kernels_available  # noqa: E402
from ._src.dtypes import normalize_dtype  # noqa: E402
from ._src.errors import (AmpListConflict, GpuProbeError, LossScaleAtFloorError,  # noqa: E402
                          NonFiniteForwardWarning, SlowerThanFloat32Warning)
from ._src.gluon import convert, converted_graph, remove_hooks  # noqa: E402
from ._src.graph.convert import convert_symbol  # noqa: E402
from ._src.graph.plan import explain, format_explain  # noqa: E402
from ._src.graph.strip import count_casts, remove_casts  # noqa: E402
from ._src.policy.policy import Policy  # noqa: E402
from ._src.scaling import (DynamicLossScaler, LossScaleGroup, LossScaler,  # noqa: E402
                           NoOpLossScaler, StaticLossScaler, make_loss_scaler)
from ._src.training.trainer import Trainer  # noqa: E402
from ._src.graph.symbol_json import install_symbol_loaders as _install_symbol_loaders  # noqa: E402,E501

# A graph holding ops of mxmp's library (written with library_ops=True) loads after `import
# mxmp`: the library is built or loaded when such a graph is loaded, not now.
_install_symbol_loaders()

__version__ = '0.1.0'

#: Public names loaded on first use: name -> defining module.
_ON_FIRST_USE = {
    'Module': 'mxmp._src.training.module',
    'BucketingModule': 'mxmp._src.training.bucketing',
    'diagnose': 'mxmp._src.diagnose.capture',
    'NumericsReport': 'mxmp._src.diagnose.report',
    'plot_run': 'mxmp._src.plotting',
    'check_kernels': 'mxmp._src.conformance.check',
    'KernelReport': 'mxmp._src.policy.kernel_report',
    'load_kernel_report': 'mxmp._src.policy.kernel_report',
    'freeze': 'mxmp._src.freeze',
    'check_alignment': 'mxmp._src.alignment',
    'format_alignment': 'mxmp._src.alignment',
    'Misalignment': 'mxmp._src.alignment',
}


def __getattr__(name):
    """PEP 562: load ``mxmp.amp`` and the names of :data:`_ON_FIRST_USE` when first used."""
    if name == 'amp':
        return importlib.import_module('mxmp.amp')
    if name in _ON_FIRST_USE:
        value = getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError('module mxmp has no attribute %r' % name)


__all__ = ['convert', 'converted_graph', 'freeze', 'remove_hooks', 'convert_symbol', 'remove_casts', 'count_casts',
           'explain', 'format_explain', 'Policy', 'AmpListConflict', 'normalize_dtype',
           'lp_kernels_available', 'Trainer', 'LossScaler', 'DynamicLossScaler',
           'StaticLossScaler', 'NoOpLossScaler', 'make_loss_scaler', 'LossScaleGroup',
           'LossScaleAtFloorError',
           'NonFiniteForwardWarning', 'SlowerThanFloat32Warning', 'GpuProbeError', 'Module',
           'BucketingModule', 'amp', 'diagnose',
           'NumericsReport', 'plot_run', 'check_kernels', 'KernelReport', 'load_kernel_report',
           'check_alignment', 'format_alignment', 'Misalignment', 'preload_cuda_libraries',
           'missing_cuda_libraries', 'CudaLibrariesNotFound']
