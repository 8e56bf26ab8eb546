"""The calls an inference-only network of :func:`mxmp.freeze` refuses, and their errors
(checked by the hook module, :mod:`mxmp._src.gluon`, on every call once a network was frozen),
and its ``export``.
"""
from mxnet import autograd

__all__ = ['check_call', 'export_frozen']


def check_call(block, consumed_from, frozen_from):
    """Raise RuntimeError for a call of ``block`` (a HybridBlock) that :func:`mxmp.freeze` forbids:
    any call of a block it consumed (``consumed_from``: the name of the block frozen, else
    None), a training call (``autograd.record()`` or ``train_mode()``) of one it made
    (``frozen_from``: the name of its source, else None)."""
    if consumed_from is not None:
        raise RuntimeError(
            '%s was frozen by mxmp.freeze (with %s): its arrays moved into the block '
            'mxmp.freeze returned, call that one. To train, build the network anew and load its '
            'float32 checkpoint (saved before freezing).' % (block.name, consumed_from))
    if frozen_from is not None and (autograd.is_recording() or autograd.is_training()):
        raise RuntimeError(
            '%s is the inference-only network mxmp.freeze made from %s (no gradients, BatchNorm '
            'folded): it cannot run under autograd.record() or train_mode(). To train, build '
            'the network anew, load its float32 checkpoint and mxmp.convert it.'
            % (block.name, frozen_from))


def export_frozen(block, path, epoch, remove_amp_cast, export, library_ops=False):
    """``block.export(path, epoch)`` of a network :func:`mxmp.freeze` made, through MXNet's
    ``export`` (the function ``export``): its graph with its casts and its stored dtypes,
    which plain MXNet's ``SymbolBlock.imports`` runs: MXNet's own ops in place of those of
    mxmp's library the frozen network runs, unless ``library_ops`` (then the files load after
    ``import mxmp``).

    Raises:
        ValueError: ``remove_amp_cast=True`` was asked for: without its casts the graph would
            feed bfloat16 weights to float32 inputs (only None, MXNet's default, or False).
    """
    if remove_amp_cast:
        raise ValueError(
            '%s is a network mxmp.freeze made: its casts and stored dtypes are its graph, so '
            'export(path) writes them (plain MXNet runs the files); remove_amp_cast=True would '
            'write a graph that cannot run. For a float32 model, export the float32 network '
            'before freezing.' % block.name)
    out = export(block, path, epoch, remove_amp_cast=False)
    if not library_ops:
        from .graph.strip import write_mxnet_ops
        write_mxnet_ops('%s-symbol.json' % path)
    return out
