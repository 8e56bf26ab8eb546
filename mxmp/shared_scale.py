"""Moved to :mod:`mxmp.scaling.shared`; this module re-exports the old names."""
from .scaling.shared import ScaleGroup, group_for  # noqa: F401

__all__ = ['ScaleGroup', 'group_for']
