"""PNG plots (matplotlib, Agg backend, imported only when a plot is drawn).

* :mod:`.run_curves` -- :func:`plot_run`: the training curves of a metrics JSON-lines file.
* :mod:`.report_charts` -- the charts of :func:`mxmp._src.diagnose`'s report (gradient histogram,
  layer ranges) against float16's or bfloat16's range. It imports :mod:`mxmp._src.diagnose.stats`;
  nothing in :mod:`mxmp._src.diagnose` imports this package at load time.
* :mod:`.figures` -- pyplot with the Agg backend, and saving a figure as a PNG.
"""
