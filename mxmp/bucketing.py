"""Old import path of :class:`mxmp.BucketingModule`: it moved to :mod:`mxmp.training.bucketing`."""
from .training.bucketing import BucketingModule

__all__ = ['BucketingModule']
