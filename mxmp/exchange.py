"""Moved to :mod:`mxmp.distributed.exchange`; this module re-exports the old names."""
from .distributed.exchange import (EXCHANGE_DTYPES, GradientExchange,  # noqa: F401
                                   check_grad_dtype, exchange_dtype, itemsize, wire_dtype)

__all__ = ['EXCHANGE_DTYPES', 'check_grad_dtype', 'exchange_dtype', 'wire_dtype', 'itemsize',
           'GradientExchange']
