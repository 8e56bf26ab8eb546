"""The old import paths of the diagnosis and plots still give the same objects as the new ones."""
import mxmp
import mxmp.numerics
import mxmp.numerics_plot
import mxmp.plot
import mxmp.plotting
from mxmp.diagnose import report, stats


def test_old_import_paths_reexport_the_new_objects():
    from mxmp.diagnose import NumericsReport, diagnose
    assert mxmp.diagnose is diagnose and mxmp.NumericsReport is NumericsReport
    assert mxmp.plot.plot_run is mxmp.plotting.plot_run is mxmp.plot_run
    for name in mxmp.numerics.__all__:
        assert getattr(mxmp.numerics, name) is (getattr(stats, name, None)
                                                or getattr(report, name))
    for module in (mxmp.plot, mxmp.numerics_plot):
        for name in module.__all__:
            assert getattr(module, name) is getattr(mxmp.plotting, name)
