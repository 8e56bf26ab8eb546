"""Moved to :mod:`mxmp.training.trainer` (its kvstore glue to :mod:`mxmp.distributed.kvstore`,
its states file to :mod:`mxmp.training.checkpoint`); this module re-exports the old names."""
from .training.trainer import Trainer  # noqa: F401

__all__ = ['Trainer']
