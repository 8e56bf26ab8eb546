"""Every exception and warning mxmp raises (subclassing what code for MXNet or contrib.amp
already catches), and the one-line reason of an MXNet error. Imports nothing from MXNet."""
from .cuda import CudaLibrariesNotFound

__all__ = ['AmpListConflict', 'LossScaleAtFloorError', 'NonFiniteForwardWarning',
           'SlowerThanFloat32Warning', 'ParameterFileError', 'CLIError', 'CudaLibrariesNotFound',
           'GpuProbeError', 'mxnet_error_line']


class AmpListConflict(ValueError, AssertionError):
    """An op put in two op classes at once; a ValueError and an AssertionError (what
    contrib.amp 1.9.1 asserted)."""


class LossScaleAtFloorError(RuntimeError):
    """The dynamic loss scale sat at its floor for ``max_overflows_at_floor`` overflows in a
    row. The step that raises it was skipped like any overflowing step: nothing was updated, it
    counts in ``skipped_steps``, and in a LossScaleGroup it counts as this member's step of the
    iteration (the scale backs off once the others have stepped), so catching the error and
    going on never makes another member's next step raise "already stepped".

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
    """A step was skipped because the forward pass itself gave inf/NaN (loss or outputs), not
    because the loss scale made gradients overflow; issued on every such step."""


class SlowerThanFloat32Warning(UserWarning):
    """A graph was converted to bfloat16 on real kernels on a CPU where oneDNN emulates bfloat16
    (AVX-512 without bfloat16 instructions: tier ``avx512_core``), so it will run slower than
    float32; issued once per process, with the measured matrix-product speed ratio."""


class ParameterFileError(ValueError, AssertionError):
    """A parameter file does not match the block; a ValueError and an AssertionError (what
    ``gluon.Block.load_parameters`` raises)."""


class GpuProbeError(RuntimeError):
    """The low-precision kernel probe could not run on a GPU for another reason than a missing
    kernel (an MXNet build without CUDA, a driver or CUDA mismatch, out of memory...): the
    message keeps MXNet's. Never cached: the next call probes again.

    Attributes:
        mxnet_message (str or None): MXNet's error text, None when MXNet raised none.
    """

    def __init__(self, message, mxnet_message=None):
        super().__init__(message)
        self.mxnet_message = mxnet_message


class CLIError(Exception):
    """A user error of the ``mxmp`` command: the message is printed as one line and the exit
    code is 1."""


_TRACEBACK_LINES = ('File ', '[bt]', 'Traceback', 'Stack trace', '>>>')


def mxnet_error_line(err, limit=None):
    """The last line of ``err``'s text that is not part of a traceback, without the prefixes
    ``'MXNetError: '`` and ``'Check failed: '`` (else the class name), cut to ``limit`` chars."""
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
