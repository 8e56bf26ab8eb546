"""Old import path of the plots, kept for existing code: the training curves live in
:mod:`mxmp.plotting.run_curves` and the diagnose charts in :mod:`mxmp.plotting.report_charts`."""
from .plotting.report_charts import plot_gradient_histogram, plot_layer_ranges
from .plotting.run_curves import (ACCURACY_KEYS, RUN_KEYS, TRAIN_ACCURACY_KEYS,  # noqa: F401
                                  plot_run, read_metrics, read_run_info, run_figure, run_title,
                                  was_scaled)

__all__ = ['read_metrics', 'plot_run', 'plot_gradient_histogram', 'plot_layer_ranges']
