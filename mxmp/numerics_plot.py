"""Old import path of the diagnose charts, kept for existing code: they live in
:mod:`mxmp.plotting.report_charts`."""
from .plotting.report_charts import (gradient_histogram_figure, layer_ranges_figure,
                                     plot_gradient_histogram, plot_layer_ranges)

__all__ = ['gradient_histogram_figure', 'plot_gradient_histogram', 'layer_ranges_figure',
           'plot_layer_ranges']
