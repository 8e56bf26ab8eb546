"""Moved: the step is :mod:`mxmp.training.step`, the overflow check :mod:`mxmp.scaling.overflow`,
master weights :mod:`mxmp.training.master_weights`, the atomic writers
:mod:`mxmp.training.checkpoint`. This module re-exports the old names."""
from .dtypes import LOW_PRECISION_DTYPES, dtype_name, is_low_precision  # noqa: F401
from .errors import LossScaleAtFloorError, NonFiniteForwardWarning  # noqa: F401
from .scaling.overflow import MAX_FINITE_ARRAYS, all_finite, nonfinite_names  # noqa: F401
from .training.checkpoint import save_atomic, write_atomic  # noqa: F401
from .training.master_weights import DeviceUpdate, MasterWeights, device_update  # noqa: F401
from .training.step import apply_update  # noqa: F401

__all__ = ['LOW_PRECISION_DTYPES', 'dtype_name', 'is_low_precision', 'all_finite',
           'MasterWeights', 'DeviceUpdate', 'device_update', 'apply_update', 'write_atomic',
           'save_atomic', 'LossScaleAtFloorError', 'NonFiniteForwardWarning',
           'nonfinite_names']
