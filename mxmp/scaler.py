"""Moved to :mod:`mxmp.scaling.scalers`; this module re-exports the old names."""
from .scaling.scalers import (DEFAULT_STATIC_SCALE, DynamicLossScaler, LossScaler,  # noqa: F401
                              NoOpLossScaler, StaticLossScaler, flatten_losses,
                              from_state_dict, make_loss_scaler, scale_losses)

__all__ = ['LossScaler', 'NoOpLossScaler', 'StaticLossScaler', 'DynamicLossScaler',
           'make_loss_scaler', 'DEFAULT_STATIC_SCALE', 'scale_losses', 'flatten_losses']
