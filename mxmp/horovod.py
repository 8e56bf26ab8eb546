"""Moved to :mod:`mxmp.distributed.horovod`; this module re-exports the old names (import it
explicitly: ``from mxmp.horovod import DistributedTrainer``; Horovod loads at construction)."""
from .distributed.horovod import DistributedTrainer, import_horovod  # noqa: F401

__all__ = ['DistributedTrainer', 'import_horovod']
