"""Graphs that hold ops of mxmp's operator library load after ``import mxmp``:
:func:`before_loading` runs before MXNet parses a graph, from the wrappers of MXNet's two graph
loaders, ``mx.sym.load`` and ``mx.sym.load_json`` (which ``gluon.SymbolBlock.imports``,
``mx.model.load_checkpoint`` and ``mx.mod.Module.load`` call), that ``import mxmp`` installs
(:func:`mxmp._src.graph.symbol_json.install_symbol_loaders`).

Why lazily: ``import mxmp`` stays fast and never compiles; a graph without library ops (every
file mxmp writes, unless the user asks for them) never builds or loads the library; a graph
with them gets it, built once per machine (:mod:`.build`), before MXNet meets its first op.
"""
__all__ = ['before_loading']


def before_loading(source, is_file):
    """Load mxmp's library if the graph ``source`` (a file path if ``is_file``, else its JSON
    text) holds its ops. Anything unreadable is left to MXNet's own error.

    Raises:
        RuntimeError: the graph holds library ops and the library cannot be built or loaded
            here (the message gives the reason and the fix).
    """
    if is_file:
        try:
            with open(source) as f:
                text = f.read()
        except (OSError, TypeError, UnicodeDecodeError):
            return
    elif isinstance(source, str):
        text = source
    else:
        return
    if 'mxmp_' not in text:
        return
    from .build import _STATE, library_ops_in, load_library
    ops = library_ops_in(text)
    if ops and load_library() is None:
        raise RuntimeError(
            'the graph holds ops of mxmp\'s operator library (%s), which cannot be loaded '
            'here: %s. Write the graph again without them (mxmp\'s exports hold MXNet\'s own '
            'ops unless library_ops=True), or make the library build (a C++ compiler, '
            'MXMP_KERNELS unset)' % (', '.join(ops), _STATE.get('reason', 'unknown reason')))

