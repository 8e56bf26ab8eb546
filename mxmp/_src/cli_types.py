"""The argument types of the ``mxmp`` command's options (argparse ``type=`` callables: each
returns the parsed value or raises ``argparse.ArgumentTypeError`` naming the expected form)."""
import argparse

__all__ = ['dtype', 'ints', 'shape', 'triple', 'number', 'FASHION_MNIST_MEAN', 'FASHION_MNIST_STD']

_DTYPE_ALIASES = {'float16': 'float16', 'fp16': 'float16', 'half': 'float16',
                  'bfloat16': 'bfloat16', 'bf16': 'bfloat16'}
#: mean/std of Fashion-MNIST on the 0-255 scale (as examples/train_imagenet.py).
FASHION_MNIST_MEAN, FASHION_MNIST_STD = (72.94,) * 3, (90.02,) * 3


def dtype(text):
    """The target dtype a name or alias (``bf16``, ``fp16``, ``half``) stands for (str)."""
    name = _DTYPE_ALIASES.get(str(text).lower())
    if name is None:
        raise argparse.ArgumentTypeError('unknown dtype %r: mxmp converts to float16 (NVIDIA '
                                         'GPUs) or bfloat16 (CPUs with oneDNN)' % text)
    return name


def ints(text):
    """Positive integers separated by commas (or ``x``): a tuple of int."""
    try:
        values = tuple(int(v) for v in text.replace('x', ',').split(',') if v.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError('expected positive integers separated by commas, e.g. '
                                         '3,224,224; got %r' % text)
    return values


def shape(text):
    """``NAME=D1,D2,...``: ``(name, tuple of int)``."""
    name, sep, dims = text.partition('=')
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError('expected NAME=D1,D2,..., e.g. data=1,3,224,224; got %r'
                                         % text)
    return name.strip(), ints(dims)


def triple(text):
    """One number (used three times) or three separated by commas: a tuple of 3 floats."""
    try:
        values = tuple(float(v) for v in text.split(','))
    except ValueError:
        values = ()
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise argparse.ArgumentTypeError('expected one number or three separated by commas, '
                                         'got %r' % text)
    return values


def number(kind, low, high=None, low_open=False):
    """An argparse type: ``kind`` (int or float) in ``[low, high]`` (``(low, high]`` with
    ``low_open``; no upper bound for ``high=None``), else ArgumentTypeError naming the range."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < low or (low_open and value == low) or \
                (high is not None and value > high):
            raise argparse.ArgumentTypeError('expected %s %s %s%s, got %r' % (
                'an integer' if kind is int else 'a number', '>' if low_open else '>=', low,
                '' if high is None else ' and <= %s' % high, text))
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its messages
    return parse
