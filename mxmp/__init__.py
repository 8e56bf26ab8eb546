"""mxmp: mixed-precision (float16 / bfloat16) training and inference for Apache MXNet 1.x.

This module only re-exports the public API. Where each job lives (README, "Where things are"):

* :mod:`mxmp.dtypes`, :mod:`mxmp.errors` -- dtype names and mshadow's enum; every exception.
* :mod:`mxmp.policy` -- :class:`Policy`: target dtype, op classes, overrides
  (``ops_shared.py`` + ``ops_float16.py`` / ``ops_bfloat16.py``, the differences only).
* :mod:`mxmp.graph` -- the pass (``convert.py``), :func:`explain`, :func:`remove_casts`
  (``strip.py``), loss-scale inputs (``loss_heads.py``).
* :mod:`mxmp.gluon` -- :func:`convert`: a Gluon HybridBlock in mixed precision;
  :mod:`mxmp.block_params` its checkpoints; :mod:`mxmp.fusion` oneDNN-fused inference;
  :mod:`mxmp.layout` arrays oneDNN reordered, back to the default layout.
* :mod:`mxmp.scaling` -- loss scalers (``scalers.py``), the overflow check (``overflow.py``),
  one scale shared by several Trainers (``shared.py``).
* :mod:`mxmp.training` -- the one training step (``step.py``), master weights,
  :class:`Trainer`, :class:`Module`, :class:`BucketingModule`, checkpoint files.
* :mod:`mxmp.distributed` -- gradient exchange, the root-rank broadcast, kvstore, Horovod
  (``mxmp.horovod.DistributedTrainer``).
* :mod:`mxmp.amp` -- ``mxnet.contrib.amp``'s names on mxmp (``mxmp/compat/contrib_amp.py``).
* :mod:`mxmp.device` -- :func:`lp_kernels_available`; :mod:`mxmp.conformance` --
  :func:`check_kernels` (``mxmp check-kernels``).
* :mod:`mxmp.diagnose`, :mod:`mxmp.plotting` -- per-layer overflow/underflow, and plots.
* :mod:`mxmp.alignment` (Tensor Core size rules), :mod:`mxmp.cuda` (CUDA 11 libraries),
  :mod:`mxmp.cli` (the ``mxmp`` command).

The modules ``mxmp.update``, ``scaler``, ``shared_scale``, ``trainer``, ``module``,
``bucketing``, ``exchange``, ``casts``, ``lists``, ``kernel_report``, ``numerics``, ``plot``
and ``numerics_plot`` are the old import paths, kept as re-exports.
"""
# First, before anything imports mxnet: with mxnet-cu112 installed (or MXMP_PRELOAD_CUDA=1),
# make the CUDA 11 libraries of the nvidia-*-cu11 wheels visible to it.
from . import cuda as _cuda
_cuda.preload_if_needed()

from .dtypes import normalize_dtype  # noqa: E402
from .errors import (AmpListConflict, CudaLibrariesNotFound, LossScaleAtFloorError,  # noqa: E402
                     NonFiniteForwardWarning)
from .policy import Policy  # noqa: E402
from .graph import convert_symbol, remove_casts, explain, format_explain, count_casts  # noqa: E402
from .device import lp_kernels_available  # noqa: E402
from .gluon import convert, converted_graph  # noqa: E402
from .scaling.scalers import (LossScaler, DynamicLossScaler, StaticLossScaler,  # noqa: E402
                              NoOpLossScaler, make_loss_scaler)
from .training.trainer import Trainer  # noqa: E402
from .training.module import Module  # noqa: E402
from .training.bucketing import BucketingModule  # noqa: E402
from .alignment import check_alignment, format_alignment, Misalignment  # noqa: E402
from .cuda import preload_cuda_libraries, missing_cuda_libraries  # noqa: E402
from .diagnose import diagnose, NumericsReport  # noqa: E402
from .plotting import plot_run  # noqa: E402
from .conformance import check_kernels  # noqa: E402
from .policy.kernel_report import KernelReport, load_kernel_report  # noqa: E402
from . import amp  # noqa: E402
# the old import paths, so that ``mxmp.update.save_atomic`` after ``import mxmp`` still works
from . import (bucketing, casts, conformance_cases, conformance_run, exchange,  # noqa: E402,F401
               kernel_report, lists, module, plot,
               scaler, shared_scale, trainer, update)

__version__ = '0.1.0'

__all__ = ['Policy', 'AmpListConflict', 'normalize_dtype', 'convert_symbol', 'remove_casts',
           'explain', 'format_explain', 'count_casts', 'lp_kernels_available', 'convert',
           'converted_graph', 'LossScaler', 'DynamicLossScaler', 'StaticLossScaler',
           'NoOpLossScaler', 'make_loss_scaler', 'LossScaleAtFloorError',
           'NonFiniteForwardWarning', 'Trainer', 'Module', 'BucketingModule', 'check_alignment',
           'format_alignment', 'Misalignment', 'preload_cuda_libraries', 'missing_cuda_libraries',
           'CudaLibrariesNotFound', 'diagnose', 'NumericsReport', 'plot_run', 'amp', 'plot',
           'check_kernels', 'KernelReport', 'load_kernel_report']
