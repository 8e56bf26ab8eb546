"""mxmp: mixed-precision (float16 / bfloat16) training and inference for Apache MXNet 1.x.

The pieces, one module each:

* :mod:`mxmp.policy` -- :class:`Policy`: target dtype, op classes (``mxmp/lists``), overrides.
* :mod:`mxmp.graph` -- the pass: :func:`convert_symbol`, :func:`remove_casts`, :func:`explain`.
* :mod:`mxmp.gluon` -- :func:`convert`: a Gluon HybridBlock in mixed precision.
* :mod:`mxmp.block_params` -- a converted block's checkpoints, as the float32 network's.
* :mod:`mxmp.fusion` -- oneDNN-fused inference graphs (the converted block's default where the
  kernels run; ``mxmp convert --fuse``).
* :mod:`mxmp.device` -- :func:`lp_kernels_available`: does this device have the kernels.
* :mod:`mxmp.scaler` -- loss scalers (dynamic, static, no-op).
* :mod:`mxmp.shared_scale` -- one loss scale shared by several Trainers (PyTorch's habit).
* :mod:`mxmp.trainer` -- :class:`Trainer`: loss scaling, skipped steps, float32 master weights.
* :mod:`mxmp.module` -- :class:`Module`: the same for the Symbolic Module API.
* :mod:`mxmp.update` -- the overflow check and master weights both of them use.
* :mod:`mxmp.layout` -- arrays oneDNN reordered back to MXNet's default layout before a cast.
* :mod:`mxmp.alignment` -- :func:`check_alignment`: Tensor Core size rules for float16.
* :mod:`mxmp.cuda` -- preloads the CUDA 11 libraries of the ``nvidia-*-cu11`` wheels.
* :mod:`mxmp.diagnose` -- :func:`diagnose`: which layers overflow or underflow, per dtype
  (``capture.py`` runs the network, ``stats.py`` number formats, histograms and verdicts,
  ``report.py`` :class:`NumericsReport`, ``inputs.py`` a saved model and a RecordIO batch).
* :mod:`mxmp.plotting` -- PNG plots: :func:`plot_run` (``run_curves.py``, training curves from a
  metrics JSON-lines file) and the diagnose charts (``report_charts.py``, in float16's or
  bfloat16's own format). ``mxmp.plot``, ``mxmp.numerics`` and ``mxmp.numerics_plot`` are the
  old import paths, kept.
* :mod:`mxmp.amp` -- ``mxnet.contrib.amp``'s names on mxmp, without monkey patching.
* :mod:`mxmp.conformance` -- :func:`check_kernels`: is each low-precision op correct on this
  machine's kernels (``mxmp check-kernels``); :mod:`mxmp.kernel_report` its report.
* :mod:`mxmp.cli` -- the ``mxmp`` command line.
"""
# First, before anything imports mxnet: with mxnet-cu112 installed (or MXMP_PRELOAD_CUDA=1),
# make the CUDA 11 libraries of the nvidia-*-cu11 wheels visible to it.
from . import cuda as _cuda
_cuda.preload_if_needed()

from .policy import Policy, AmpListConflict, normalize_dtype  # noqa: E402
from .graph import convert_symbol, remove_casts, explain, format_explain, count_casts
from .device import lp_kernels_available
from .gluon import convert, ConvertedBlock
from .scaler import (LossScaler, DynamicLossScaler, StaticLossScaler, NoOpLossScaler,
                     make_loss_scaler)
from .trainer import Trainer
from .update import LossScaleAtFloorError, NonFiniteForwardWarning
from .module import Module
from .bucketing import BucketingModule
from .alignment import check_alignment, format_alignment, Misalignment
from .cuda import preload_cuda_libraries, missing_cuda_libraries, CudaLibrariesNotFound
from .diagnose import diagnose, NumericsReport
from .plot import plot_run
from .conformance import check_kernels
from .kernel_report import KernelReport, load_kernel_report
from . import amp, plot

__version__ = '0.1.0'

__all__ = ['Policy', 'AmpListConflict', 'normalize_dtype', 'convert_symbol', 'remove_casts', 'explain',
           'format_explain', 'count_casts', 'lp_kernels_available', 'convert', 'ConvertedBlock',
           'LossScaler', 'DynamicLossScaler', 'StaticLossScaler', 'NoOpLossScaler',
           'make_loss_scaler', 'LossScaleAtFloorError', 'NonFiniteForwardWarning', 'Trainer', 'Module', 'BucketingModule', 'check_alignment', 'format_alignment', 'Misalignment',
           'preload_cuda_libraries', 'missing_cuda_libraries', 'CudaLibrariesNotFound',
           'diagnose', 'NumericsReport', 'plot_run', 'amp', 'plot', 'check_kernels',
           'KernelReport', 'load_kernel_report']
