"""mxmp: mixed-precision (float16 / bfloat16) training and inference for Apache MXNet 1.x.

The pieces, one module each:

* :mod:`mxmp.policy` -- :class:`Policy`: target dtype, op classes (``mxmp/lists``), overrides.
* :mod:`mxmp.graph` -- the pass: :func:`convert_symbol`, :func:`remove_casts`, :func:`explain`.
* :mod:`mxmp.gluon` -- :func:`convert`: a Gluon HybridBlock in mixed precision.
* :mod:`mxmp.device` -- :func:`lp_kernels_available`: does this device have the kernels.
* :mod:`mxmp.scaler` -- loss scalers (dynamic, static, no-op).
* :mod:`mxmp.trainer` -- :class:`Trainer`: loss scaling, skipped steps, float32 master weights.
"""
from .policy import Policy, normalize_dtype
from .graph import convert_symbol, remove_casts, explain, format_explain, count_casts
from .device import lp_kernels_available
from .gluon import convert, ConvertedBlock
from .scaler import (LossScaler, DynamicLossScaler, StaticLossScaler, NoOpLossScaler,
                     make_loss_scaler)
from .trainer import Trainer

__version__ = '0.1.0'

__all__ = ['Policy', 'normalize_dtype', 'convert_symbol', 'remove_casts', 'explain',
           'format_explain', 'count_casts', 'lp_kernels_available', 'convert', 'ConvertedBlock',
           'LossScaler', 'DynamicLossScaler', 'StaticLossScaler', 'NoOpLossScaler',
           'make_loss_scaler', 'Trainer']
