"""The states file of :meth:`mxmp.Trainer.save_states`: a header (magic, payload length,
SHA-256 of the payload) and a pickled payload (optimizer, master weights, loss scaler,
skipped_steps, target dtype, a record of every Parameter checked on load).
"""
import hashlib
import os
import pickle
import struct

import numpy as np

from ..dtypes import LOW_PRECISION_DTYPES, dtype_name
from ..files import write_atomic
from .master_weights import is_low_precision

__all__ = ['check_format', 'write_trainer_states', 'read_trainer_states']

#: Header of the states file written by :meth:`mxmp.Trainer.save_states`.
_MAGIC = b'MXMP-TRAINER-STATES\x00'
_FORMAT_VERSION = 1
_HEADER = struct.Struct('<Q32s')   # payload length, sha256 of the payload


def write_trainer_states(fname, params, state):
    """Write a states file atomically: header, then ``state`` (dict) pickled with the record
    of every Parameter of ``params``."""
    payload = pickle.dumps(dict({'format': 'mxmp.Trainer', 'version': _FORMAT_VERSION,
                                 'params': _param_records(params)}, **state), protocol=4)
    write_atomic(fname, _MAGIC + _HEADER.pack(len(payload), hashlib.sha256(payload).digest())
                 + payload)


def _read_payload(fname):
    """The checked payload of a states file (ValueError: bad header, truncated, corrupt,
    undecodable, another format version, no optimizer)."""
    with open(fname, 'rb') as fin:
        blob = fin.read()
    if not blob.startswith(_MAGIC):
        hint = (' (it looks like a pickle, e.g. from gluon.Trainer.save_states)'
                if blob[:1] == b'\x80' else '')
        raise ValueError('%s is not an mxmp Trainer states file: bad header%s'
                         % (fname, hint))
    head = blob[len(_MAGIC):len(_MAGIC) + _HEADER.size]
    if len(head) < _HEADER.size:
        raise ValueError('%s is truncated: the header is incomplete' % fname)
    length, digest = _HEADER.unpack(head)
    payload = blob[len(_MAGIC) + _HEADER.size:]
    if len(payload) != length:
        raise ValueError('%s is truncated or has trailing data: payload is %d bytes, the '
                         'header says %d' % (fname, len(payload), length))
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError('%s is corrupt: the SHA-256 of its payload does not match the '
                         'header' % fname)
    try:
        state = pickle.loads(payload)
        opt_states = pickle.loads(state['optimizer'])
    except Exception as err:  # pylint: disable=broad-except
        raise ValueError('%s cannot be decoded: %s' % (fname, err)) from None
    check_format(state, fname, 'mxmp.Trainer', _FORMAT_VERSION)
    if not (isinstance(opt_states, tuple) and len(opt_states) == 2):
        raise ValueError('%s holds no optimizer (was it saved by mxmp.Trainer?)' % fname)
    return state


def check_format(state, fname, name, version):
    """ValueError unless ``state``, read from ``fname``, is a dict with ``format`` ``name``
    and ``version`` ``version``."""
    if not isinstance(state, dict) or state.get('format') != name:
        raise ValueError('%s is not an %s states file' % (fname, name))
    if state.get('version') != version:
        raise ValueError('%s has format version %r; this mxmp reads version %d'
                         % (fname, state.get('version'), version))


def _check_param_records(fname, saved, mine, check_names):
    """ValueError naming the first difference between the file's and the Trainer's records."""
    if len(saved) != len(mine):
        raise ValueError('%s holds states for %d Parameters but this Trainer has %d'
                         % (fname, len(saved), len(mine)))
    for k, (s, m) in enumerate(zip(saved, mine)):
        if check_names and s['name'] != m['name']:
            raise ValueError('%s: Parameter %d is %r in the file but %r here (build the '
                             'network with the same prefixes, or pass check_names=False)'
                             % (fname, k, s['name'], m['name']))
        if list(s['shape']) != m['shape'] and 0 not in m['shape']:
            raise ValueError('%s: Parameter %d (%s) has shape %s in the file but %s here'
                             % (fname, k, m['name'], tuple(s['shape']), tuple(m['shape'])))
        # a Parameter frozen (grad_req='null') on one side only has a master weight on the
        # other: accepted, as gluon.Trainer loads it (made from the weight when unfrozen)
        if s['dtype'] != m['dtype'] and (s['master'] or m['master']):
            raise ValueError('%s: Parameter %d (%s) is %s in the file but %s here: the states '
                             'come from a run with another target dtype (master weights exist '
                             'only for float16/bfloat16 Parameters); cast the network as in '
                             'that run (%s), or start the optimizer afresh'
                             % (fname, k, m['name'], s['dtype'], m['dtype'], s['dtype']))


def _param_records(params):
    return [{'name': p.name, 'shape': [int(s) for s in p.shape],
             'dtype': dtype_name(p.dtype), 'master': is_low_precision(p)} for p in params]


def read_trainer_states(fname, params, check_names, scaler):
    """``(optimizer blob, {index: float32 numpy master}, loss scaler, skipped_steps)`` of a
    states file, checked against a Trainer of ``params`` and ``scaler`` (ValueError as
    :meth:`mxmp.Trainer.load_states`)."""
    fname = os.fspath(fname)
    state = _read_payload(fname)
    try:
        saved_params = state['params']
        masters = state['master_weights']
        scaler_state = state['loss_scaler']
        skipped = int(state['skipped_steps'])
        opt_blob = state['optimizer']
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError('%s misses a field: %s' % (fname, err)) from None
    records = _param_records(params)
    try:
        _check_param_records(fname, saved_params, records, check_names)
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError('%s: malformed Parameter records: %r' % (fname, err)) from None
    out = {}
    for i, rec in enumerate(records):
        if rec['dtype'] not in LOW_PRECISION_DTYPES:
            continue
        arr = masters.get(i) if isinstance(masters, dict) else None
        if arr is None and not (rec['master'] and saved_params[i]['master']):
            continue   # frozen when saved, without masters yet: made from the weight
        # (a master saved for a Parameter frozen here is kept for its unfreezing)
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or \
                (0 not in rec['shape'] and list(arr.shape) != rec['shape']):
            raise ValueError('%s: the master weight of Parameter %d (%s) is missing or has '
                             'the wrong shape/dtype' % (fname, i, rec['name']))
        out[i] = arr
    return opt_blob, out, scaler.load_state_dict(scaler_state), skipped
