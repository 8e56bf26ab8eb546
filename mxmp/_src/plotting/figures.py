"""matplotlib for mxmp's plots: pyplot with the non-interactive Agg backend (no display needed),
imported only when a plot is drawn, and saving a figure as a PNG."""
import os

__all__ = ['pyplot', 'save_png']


def pyplot():
    """``matplotlib.pyplot`` with the Agg backend selected (ImportError without matplotlib)."""
    import matplotlib
    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, out_png):
    """Save ``fig`` to ``out_png`` (100 dpi; the directory and its parents are created if
    needed), close it and return ``out_png``."""
    plt = pyplot()
    directory = os.path.dirname(os.path.abspath(out_png))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return out_png
