"""Parameter files of a converted network: one float32 copy per parameter, the usual names.

``save_parameters``/``load_parameters`` of a network converted by :func:`mxmp.convert` use these
functions, so its checkpoint is the float32 network's: the structural names
``net.save_parameters`` writes (``Block._collect_params_with_prefix``, MXNet 1.9.1), float32
values by default whatever dtype a parameter is stored in, and, where an :class:`mxmp.Trainer`
keeps a float32 master weight (:func:`mxmp._src.training.master_weights.master_value`), that
master rather than its rounding; loading sets those masters to the file's values.
"""
import os

import numpy as np
import mxnet as mx
from mxnet import autograd

from .dtypes import dtype_name, mx_dtype, normalize_dtype
from .errors import ParameterFileError
from .files import save_atomic
from .gluon_graph import PARAM_POLICY, STORED_FROM
from .training.master_weights import master_value, set_master_value

__all__ = ['ParameterFileError', 'save_block_parameters', 'load_block_parameters',
           'holds_conversion', 'save_parameters', 'load_parameters',
           'save_param_dict', 'load_param_dict']


def _value(param, dtype):
    """What to write for ``param``: its value in ``dtype`` (a name; None: its stored dtype)."""
    master = master_value(param) if dtype == 'float32' else None
    with autograd.pause():
        if master is not None:
            value = master.copyto(mx.cpu())
        else:
            value = param._reduce()
        if dtype is not None and dtype_name(value.dtype) != dtype:
            value = mx.nd.amp_cast(value, dtype=mx_dtype(dtype))
    return value


def _is_float(param):
    return np.issubdtype(np.dtype(param.dtype), np.floating) or \
        dtype_name(param.dtype) == 'bfloat16'


def save_block_parameters(block, filename, deduplicate=False, dtype='float32'):
    """Write the parameters of ``block`` (converted or not) to ``filename`` atomically, as
    ``gluon.Block.save_parameters`` (``nd.save`` format, ``deduplicate`` as there). ``dtype``
    of every floating-point value: ``'float32'`` (a Trainer's master weights where it keeps
    them), ``'bfloat16'``, ``'float16'``, or None for each one's stored dtype.

    Raises:
        ValueError: unknown ``dtype`` (the message names the accepted ones).
        RuntimeError: (from MXNet) a parameter is not initialized.
    """
    if dtype is not None:
        dtype = normalize_dtype(dtype, allow_float32=True)
    params = block._collect_params_with_prefix()   # the names of plain save_parameters
    if deduplicate:
        # as gluon 1.9.1: a shared Parameter is written under its last name
        last = {param: name for name, param in params.items()}
        params = {name: params[name] for name in last.values()}
    arrays = {}
    for name, param in params.items():
        arrays[name] = _value(param, dtype if _is_float(param) else None)

    def write(tmp):
        mx.nd.save(tmp, arrays)
    save_atomic(filename, write)


def _lookup(block):
    """Name resolution for a file's keys: structural names; then, as plain Gluon 1.9.1 reads
    a file without dotted names (``collect_params().save(f, strip_prefix=block.prefix)``,
    ``Block.load_parameters``' legacy path), the block's prefix and the key; then full names.
    """
    structural = block._collect_params_with_prefix()
    full = {}
    for param in structural.values():
        full.setdefault(param.name, param)
    for name, param in block.collect_params().items():
        full.setdefault(name, param)

    def find(key):
        """(Parameter or None, rank): rank 0 for a structural name, 1 for the prefix and the
        key, 2 for a full name."""
        if key in structural:
            return structural[key], 0
        for tag in ('arg:', 'aux:'):                           # HybridBlock.export files
            if key.startswith(tag):
                key = key[len(tag):]
        if block.prefix + key in full:
            return full[block.prefix + key], 1
        return full.get(key), 2
    return structural, find


def load_block_parameters(block, filename, ctx=None, allow_missing=False, ignore_extra=False,
                          cast_dtype=False, dtype_source='current'):
    """Load a parameter file into ``block`` (converted or not), as
    ``gluon.Block.load_parameters`` (``ctx``, ``allow_missing``, ``ignore_extra``; ``cast_dtype``
    is accepted: values are always cast; ``dtype_source``: ``'current'`` only).

    Accepts files of ``save_parameters`` (structural names), :func:`save_block_parameters`,
    ``export`` (``arg:``/``aux:`` keys) and ``collect_params().save`` (full names). Every value
    is cast (``amp_cast``) to the dtype the Parameter is stored in; a Trainer's master weight
    of a Parameter (:func:`~mxmp._src.training.master_weights.set_master_value`) becomes the
    file's value.

    Raises:
        ParameterFileError: (ValueError and AssertionError) a parameter is missing from the
            file (without ``allow_missing``), or a key names no parameter (without
            ``ignore_extra``); the message names it and the flag.
        ValueError: ``dtype_source`` is not ``'current'``.
        FileNotFoundError: no such file.
        AssertionError: (from MXNet) a shape in the file does not match the parameter's.
    """
    del cast_dtype
    if dtype_source != 'current':
        raise ValueError("dtype_source=%r: a converted block keeps the dtypes it was converted "
                         "with; use dtype_source='current' (values are cast to them)"
                         % (dtype_source,))
    if not os.path.isfile(filename):
        raise FileNotFoundError('no such parameter file: %s' % (filename,))
    loaded = mx.nd.load(os.fspath(filename))
    if not isinstance(loaded, dict):
        raise ParameterFileError('%s holds a list of arrays without names; save parameters '
                                 'with save_parameters (a dict by name)' % filename)
    structural, find = _lookup(block)
    chosen = {}   # param -> (rank, param, value): a structural name wins over a full one
    for key, value in loaded.items():
        param, rank = find(key)
        if param is None:
            if not ignore_extra:
                raise ParameterFileError(
                    "Parameter '%s' loaded from file '%s' is not present in this block, which "
                    "contains parameters %s. Set ignore_extra=True to ignore."
                    % (key, filename, _brief(structural)))
            continue
        if param not in chosen or rank < chosen[param][0]:
            chosen[param] = (rank, param, value)
    if not allow_missing:
        for name, param in structural.items():
            if param not in chosen:
                raise ParameterFileError(
                    "Parameter '%s' is missing in file '%s', which contains parameters: %s. "
                    "Set allow_missing=True to ignore missing parameters."
                    % (name, filename, _brief(loaded)))
    _load_values([(param, value) for _, param, value in chosen.values()], ctx)


def _load_values(pairs, ctx):
    """Set each (Parameter, file value) of ``pairs``: the value cast (rounded to nearest even)
    to the dtype the Parameter is stored in, a Trainer's master weight to the file's value."""
    with autograd.pause():
        for param, value in pairs:
            own = dtype_name(param.dtype if param.dtype is not None else value.dtype)
            cast = value
            if own != dtype_name(value.dtype):
                cast = mx.nd.amp_cast(value, dtype=mx_dtype(own)) if own in (
                    'float32', 'float16', 'bfloat16') else value.astype(own)
            param._load_init(cast, ctx)
            set_master_value(param, value)


def _brief(names):
    names = list(names)
    return ', '.join(names[:5]) + (', ... (%d in all)' % len(names) if len(names) > 5 else '')


def holds_conversion(params):
    """Whether ``params`` (Parameters) include one of a converted network (its Policy known,
    or stored by mxmp in another dtype): then the files go through this module."""
    return any(p in PARAM_POLICY or p in STORED_FROM for p in params)


def save_parameters(block, original, filename, *args, **kwargs):
    """``Block.save_parameters`` (``original``, MXNet's): :func:`save_block_parameters` for a
    block holding Parameters of a converted network (any Block: a plain ``gluon.Block``
    converted through its HybridBlocks too), else MXNet's call."""
    if not holds_conversion(block.collect_params().values()):
        return original(block, filename, *args, **kwargs)
    return save_block_parameters(block, filename, *args, **kwargs)


def load_parameters(block, original, filename, *args, **kwargs):
    """``Block.load_parameters`` (``original``, MXNet's): :func:`load_block_parameters` for a
    block holding Parameters of a converted network, else MXNet's call."""
    if not holds_conversion(block.collect_params().values()):
        return original(block, filename, *args, **kwargs)
    return load_block_parameters(block, filename, *args, **kwargs)


def save_param_dict(params, original, filename, strip_prefix=''):
    """``ParameterDict.save`` (``original``, MXNet's) for a dict holding Parameters of a
    converted network: the same file (full names less ``strip_prefix``, written atomically)
    with every floating-point value in float32, a Trainer's master weight where it keeps one.

    Raises:
        ValueError: a Parameter's name does not start with ``strip_prefix`` (as MXNet).
    """
    if not holds_conversion(params.values()):
        return original(params, filename, strip_prefix)
    arrays = {}
    for param in params.values():
        if not param.name.startswith(strip_prefix):
            raise ValueError('strip_prefix=%r: the name of Parameter %r does not start with '
                             'it' % (strip_prefix, param.name))
        arrays[param.name[len(strip_prefix):]] = _value(param, 'float32' if _is_float(param)
                                                        else None)
    save_atomic(filename, lambda tmp: mx.nd.save(tmp, arrays))
    return None


def load_param_dict(params, original, filename, ctx=None, allow_missing=False,
                    ignore_extra=False, restore_prefix='', cast_dtype=False,
                    dtype_source='current'):
    """``ParameterDict.load`` (``original``, MXNet's) for a dict holding Parameters of a
    converted network: each value cast to the dtype its Parameter is stored in (MXNet's own
    load refuses a float32 file for a bfloat16 Parameter, and with ``cast_dtype=True`` rounds
    it otherwise than mxmp), a Trainer's master weight set to the file's value (float32 kept
    whole, as :func:`load_block_parameters`). Arguments as MXNet's; ``cast_dtype`` is accepted
    (values are always cast), ``dtype_source`` must be ``'current'``.

    Raises:
        ParameterFileError: a parameter is missing from the file (without ``allow_missing``),
            or a key names no parameter (without ``ignore_extra``).
        ValueError: ``dtype_source`` is not ``'current'``; a Parameter's name does not start
            with ``restore_prefix``.
        FileNotFoundError: no such file.
    """
    if not holds_conversion(params.values()):
        return original(params, filename, ctx, allow_missing, ignore_extra, restore_prefix,
                        cast_dtype, dtype_source)
    if dtype_source != 'current':
        raise ValueError("dtype_source=%r: a converted network keeps the dtypes it was "
                         "converted with; use dtype_source='current'" % (dtype_source,))
    bad = [n for n in params.keys() if not n.startswith(restore_prefix)]
    if bad:
        raise ValueError('restore_prefix=%r: the name of Parameter %r does not start with it'
                         % (restore_prefix, bad[0]))
    if not os.path.isfile(filename):
        raise FileNotFoundError('no such parameter file: %s' % (filename,))
    loaded = {restore_prefix + k: v for k, v in mx.nd.load(os.fspath(filename)).items()}
    extra = [k for k in loaded if k not in params.keys()]
    if extra and not ignore_extra:
        raise ParameterFileError("Parameter '%s' loaded from file '%s' is not present in this "
                                 "ParameterDict. Set ignore_extra=True to ignore."
                                 % (extra[0], filename))
    missing = [k for k in params.keys() if k not in loaded]
    if missing and not allow_missing:
        raise ParameterFileError("Parameter '%s' is missing in file '%s'. Set "
                                 "allow_missing=True to ignore." % (missing[0], filename))
    _load_values([(params[k], v) for k, v in loaded.items() if k in params.keys()], ctx)
    return None
