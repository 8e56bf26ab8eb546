"""Checkpoint files of :class:`mxmp.Module` and :class:`mxmp.BucketingModule`: MXNet's own, in
float32, plus ``prefix-%04d.mxmp.json`` (:meth:`mxmp.Module.mixed_precision_state`), all
written atomically."""
import json
import os

import mxnet as mx

from ..dtypes import normalize_dtype
from ..errors import mxnet_error_line
from ..scaling import from_state_dict
from ..files import write_atomic
from .checkpoint import check_format

__all__ = ['STATES_FORMAT', 'STATES_VERSION', 'write_state', 'restore_state',
           'read_state', 'load_params']

#: ``format`` field of ``prefix-%04d.mxmp.json``.
STATES_FORMAT = 'mxmp.Module'
#: ``version`` field of ``prefix-%04d.mxmp.json``: the one this mxmp writes and reads.
STATES_VERSION = 1


def write_state(prefix, epoch, state):
    """Write ``state`` (dict) to ``prefix-%04d.mxmp.json``."""
    write_atomic('%s-%04d.mxmp.json' % (prefix, epoch),
                 json.dumps(state, indent=1, sort_keys=True))


def restore_state(scaler, state, fname):
    """``(scaler, skipped_steps)`` from ``state`` (read from ``fname``); ValueError for a missing
    field or a scaler state of another class or configuration than ``scaler``'s."""
    try:
        return scaler.load_state_dict(state['loss_scaler']), int(state['skipped_steps'])
    except (KeyError, TypeError) as err:
        raise ValueError('%s misses a field: %s' % (fname, err)) from None
    except ValueError as err:
        raise ValueError('%s: %s' % (fname, err)) from None


def read_state(prefix, epoch, kwargs):
    """``(state or None, state file name, kwargs)``: ``prefix-%04d.mxmp.json`` if it exists,
    and the Module keyword arguments with the saved precision settings where ``kwargs`` has
    none (filled into ``kwargs``). ValueError as :meth:`mxmp.Module.load` documents."""
    state_file = '%s-%04d.mxmp.json' % (prefix, epoch)
    state = None
    if os.path.exists(state_file):
        with open(state_file, 'r', encoding='utf-8') as fin:
            try:
                state = json.load(fin)
            except ValueError as err:
                raise ValueError('%s is not valid JSON: %s' % (state_file, err)) from None
        check_format(state, state_file, STATES_FORMAT, STATES_VERSION)
        wanted = (kwargs['policy'].target_dtype if kwargs.get('policy') is not None
                  else kwargs.get('target_dtype'))
        if wanted is not None and 'target_dtype' in state and \
                normalize_dtype(wanted, allow_float32=True) != state['target_dtype']:
            raise ValueError(
                '%s was trained with target dtype %r but %r was asked for: its loss scaler '
                'and optimizer states belong to that precision. Omit target_dtype/policy to '
                'resume in %r; to change precision on purpose, load the float32 parameters '
                'with mx.model.load_checkpoint and set_params into a new Module'
                % (state_file, state['target_dtype'], wanted, state['target_dtype']))
        if 'policy' not in kwargs:
            for key in ('target_dtype', 'cast_params', 'emulate'):
                if key in state:
                    kwargs.setdefault(key, state[key])
        if 'loss_scaler' not in kwargs:
            try:
                kwargs['loss_scaler'] = from_state_dict(state.get('loss_scaler'))
            except ValueError as err:
                raise ValueError('%s: %s' % (state_file, err)) from None
    return state, state_file, kwargs


def load_params(prefix, epoch, with_symbol):
    """``(symbol or None, args, auxs)`` by ``mx.model.load_checkpoint`` (``with_symbol``) or
    ``mx.model.load_params``; ValueError (saying to load an earlier epoch) for a bad file."""
    try:
        if with_symbol:
            return mx.model.load_checkpoint(prefix, epoch)
        return (None,) + tuple(mx.model.load_params(prefix, epoch))
    except mx.base.MXNetError as err:
        files = ('%s-symbol.json / %s-%04d.params' % (prefix, prefix, epoch) if with_symbol
                 else '%s-%04d.params' % (prefix, epoch))
        raise ValueError('the checkpoint %s cannot be read: truncated or corrupt (%s); load an '
                         'earlier epoch' % (files, mxnet_error_line(err, 200))) from None
