"""Old import path of the report's data classes, kept for existing code: the number formats,
histograms and verdicts live in :mod:`mxmp.diagnose.stats`, :class:`NumericsReport` in
:mod:`mxmp.diagnose.report`."""
from .diagnose.report import NumericsReport
from .diagnose.stats import (BFLOAT16, FLOAT16, FORMATS, HIST_HI, HIST_LO, LayerStats,
                             LossScaleAdvice, NumberFormat, TensorStats)

__all__ = ['NumberFormat', 'TensorStats', 'LayerStats', 'LossScaleAdvice', 'NumericsReport',
           'FORMATS', 'FLOAT16', 'BFLOAT16', 'HIST_LO', 'HIST_HI']
