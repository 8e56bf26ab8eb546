"""Multiplying losses by the loss scale: one NDArray or lists/tuples of them nested to any depth.

Used by every ``scale_loss`` of mxmp (:class:`mxmp.Trainer`, :mod:`mxmp.amp`); re-exported by
:mod:`mxmp._src.scaling.scalers`.
"""

__all__ = ['scale_losses', 'flatten_losses']


def _walk(loss, leaf, path='loss'):
    """Apply ``leaf`` to every NDArray of a (nested) list/tuple, keeping the nesting."""
    if isinstance(loss, (list, tuple)):
        return type(loss)(_walk(l, leaf, '%s[%d]' % (path, i)) for i, l in enumerate(loss))
    from mxnet import nd
    if not isinstance(loss, nd.NDArray):
        raise TypeError('scale_loss takes an NDArray or (nested) lists/tuples of NDArrays; %s '
                        'is a %s. Compute the loss with MXNet operators (or wrap a number with '
                        'mx.nd.array) inside autograd.record().' % (path, type(loss).__name__))
    return leaf(loss)


def scale_losses(loss, scale):
    """``loss * scale`` for an NDArray or lists/tuples of them nested to any depth.

    Args:
        loss (NDArray, or list/tuple nesting NDArrays): the losses (as given to
            ``autograd.backward``, which takes a flat list: flatten with
            :func:`flatten_losses`).
        scale (float): the loss scale.

    Returns:
        the same nesting (lists stay lists, tuples tuples) of new NDArrays.

    Raises:
        TypeError: an element is not an NDArray; the message gives its position.
    """
    return _walk(loss, lambda l: l * scale)


def flatten_losses(loss):
    """The NDArrays of a (nested) list/tuple of losses as one flat list, in order.

    Raises:
        TypeError: an element is not an NDArray; the message gives its position.
    """
    out = []
    _walk(loss, out.append)
    return out
