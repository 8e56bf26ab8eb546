"""``export`` of a block converted by :func:`mxmp.convert` (called by the hook module,
:mod:`mxmp._src.gluon`): files plain MXNet loads.
"""
import mxnet as mx

from .graph.strip import float32_arrays, remove_casts, write_mxnet_ops

__all__ = ['export_converted']


def export_converted(block, path, epoch, remove_amp_cast, library_ops, export):
    """Write ``path-symbol.json`` and ``path-%04d.params`` of ``block`` (converted, its graph
    built) through MXNet's ``export`` (the function ``export``).

    Args:
        remove_amp_cast (bool): True: the float32 graph and float32 parameters (the network
            before conversion). False: the converted graph, casts and stored dtypes included.
        library_ops (bool): with ``remove_amp_cast=False``, keep the ops of mxmp's library the
            block runs (the files then load after ``import mxmp`` only); False (the default of
            ``export``): MXNet's own ops in their place, so that plain MXNet loads the files.
    """
    export(block, path, epoch, remove_amp_cast=False)
    if remove_amp_cast:
        remove_casts(block._cached_graph[1]).save('%s-symbol.json' % path)
        params_file = '%s-%04d.params' % (path, epoch)
        mx.nd.save(params_file, float32_arrays(mx.nd.load(params_file)))
    elif not library_ops:
        write_mxnet_ops('%s-symbol.json' % path)
