"""Every exception and warning mxmp raises, and the one-line reason of an MXNet error.

The exceptions subclass what code written for plain MXNet or ``mxnet.contrib.amp`` already
catches (``AssertionError`` where contrib.amp asserted, ``ImportError`` for missing libraries),
and their messages name the fix. This module imports nothing from MXNet, so that it can be
used before MXNet loads (``mxmp._src.cuda``).
"""
from .cuda import CudaLibrariesNotFound

__all__ = ['AmpListConflict', 'LossScaleAtFloorError', 'NonFiniteForwardWarning',
           'ParameterFileError', 'CLIError', 'CudaLibrariesNotFound', 'mxnet_error_line']


class AmpListConflict(ValueError, AssertionError):
    """An op is put in two op classes at once (e.g. in both ``lp_ops`` and ``fp32_ops``).

    A ``ValueError`` (what mxmp raises for bad arguments) and an ``AssertionError`` (what
    ``mxnet.contrib.amp`` 1.9.1 raised for the same conflicts, from ``assert`` statements in
    ``convert_symbol``), so code written for either catches it. The message names the ops
    and the lists.
    """


class LossScaleAtFloorError(RuntimeError):
    """The dynamic loss scale sat at its floor for ``max_overflows_at_floor`` overflows in a row.

    Raised by the training step (so by ``mxmp.Trainer.step``/``update`` and
    ``mxmp.Module.update``) instead of skipping yet another step: at the floor the scale cannot
    go lower, so the inf/NaN gradients are not an overflow that scaling causes. The message
    names the parameters whose gradients were inf/NaN on the last step and says whether the
    forward pass (the loss) was already non-finite.

    Attributes:
        parameters (list of str): names of the parameters with inf/NaN gradients (any device).
        forward_nonfinite (bool or None): whether the loss/outputs of the last step were
            inf/NaN (None: unknown).
    """

    def __init__(self, message, parameters=(), forward_nonfinite=None):
        super().__init__(message)
        self.parameters = list(parameters)
        self.forward_nonfinite = forward_nonfinite


class NonFiniteForwardWarning(RuntimeWarning):
    """A step was skipped because the forward pass itself gave inf/NaN (the loss or the
    outputs), not because the loss scale made the gradients overflow.

    Issued by the training step on every such step (Python's warning filters decide how
    often it is shown; ``warnings.simplefilter('error', NonFiniteForwardWarning)`` turns it
    into an exception). Lowering the loss scale does not fix it: look at the inputs and
    labels of the batch, the learning rate, and ops like log/exp/division/sqrt in the model.
    The weights and optimizer states are untouched by the skipped step; BatchNorm running
    statistics are updated by the forward/backward pass itself and may hold the NaN.
    """


class ParameterFileError(ValueError, AssertionError):
    """A parameter file does not match the block (a missing or unknown parameter).

    Both a ValueError (mxmp's convention for bad input) and an AssertionError (what
    ``gluon.Block.load_parameters`` raises for a missing parameter), so code written for
    either keeps working.
    """


class CLIError(Exception):
    """A user error of the ``mxmp`` command: the message is printed as one line and the exit
    code is 1."""


_TRACEBACK_LINES = ('File ', '[bt]', 'Traceback', 'Stack trace', '>>>')


def mxnet_error_line(err, limit=None):
    """The informative line of an exception; an MXNetError's text starts with a C++ traceback.

    Args:
        err (BaseException): any exception (an ``mxnet.base.MXNetError`` most often).
        limit (int or None): cut the line to at most this many characters (default: whole).

    Returns:
        str: the last line of the text that is not part of a traceback, without the prefixes
        ``'MXNetError: '`` and ``'Check failed: '``; the exception's class name if there is no
        such line.
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    out = type(err).__name__
    for line in reversed(lines):
        if not line.startswith(_TRACEBACK_LINES):
            for prefix in ('MXNetError: ', 'Check failed: '):
                if line.startswith(prefix):
                    line = line[len(prefix):]
            out = line
            break
    return out if limit is None else out[:limit]
