"""PNG plots (matplotlib, Agg backend, imported only when a plot is drawn).

* :mod:`.run_curves` -- :func:`plot_run`: the training curves of a metrics JSON-lines file.
* :mod:`.report_charts` -- the charts of :func:`mxmp.diagnose`'s report (gradient histogram,
  layer ranges) against float16's or bfloat16's range. It imports :mod:`mxmp.diagnose.stats`;
  nothing in :mod:`mxmp.diagnose` imports this package at load time.
* :mod:`.figures` -- pyplot with the Agg backend, and saving a figure as a PNG.
"""
from .report_charts import (gradient_histogram_figure, layer_ranges_figure,
                            plot_gradient_histogram, plot_layer_ranges, save_report_plots)
from .run_curves import plot_run, read_metrics, read_run_info, run_figure, run_title, was_scaled

__all__ = ['plot_run', 'read_metrics', 'read_run_info', 'run_figure', 'run_title', 'was_scaled',
           'plot_gradient_histogram', 'gradient_histogram_figure', 'plot_layer_ranges',
           'layer_ranges_figure', 'save_report_plots']
