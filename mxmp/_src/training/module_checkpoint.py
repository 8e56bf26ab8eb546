"""Checkpoint files of :class:`mxmp.Module` and :class:`mxmp.BucketingModule`: MXNet's own, in
float32, plus ``prefix-%04d.mxmp.json`` (:meth:`mxmp.Module.mixed_precision_state`), all
written atomically."""
import dataclasses
import json
import os

import mxnet as mx

from ..dtypes import normalize_dtype
from ..errors import mxnet_error_line
from ..policy.policy import Policy
from ..scaling import LossScaler, from_state_dict, make_loss_scaler
from ..files import write_atomic
from .checkpoint import check_format

__all__ = ['STATES_FORMAT', 'STATES_VERSION', 'write_state', 'restore_state',
           'read_state', 'load_params', 'policy_state', 'policy_from_state']

#: ``format`` field of ``prefix-%04d.mxmp.json``.
STATES_FORMAT = 'mxmp.Module'
#: ``version`` field of ``prefix-%04d.mxmp.json``: the one this mxmp writes and reads.
STATES_VERSION = 2

#: The :class:`mxmp.Policy` fields a checkpoint stores as lists of names.
_NAME_FIELDS = ('lp_ops', 'fp32_ops', 'excluded_names', 'follow_ops')


def policy_state(policy):
    """dict (JSON-serialisable) of ``policy`` (an :class:`mxmp.Policy` as the user chose it,
    ``emulate`` unresolved), or None for None: every field, the op lists sorted;
    ``loss_scaler`` only as a specification string (a LossScaler's state is stored apart)."""
    if policy is None:
        return None
    out = {}
    for field in dataclasses.fields(policy):
        value = getattr(policy, field.name)
        if field.name in _NAME_FIELDS:
            value = sorted(value)
        elif field.name == 'conditional_fp32' and value is not None:
            value = [[op, attr, sorted(values)] for op, attr, values in value]
        elif field.name == 'loss_scaler' and isinstance(value, LossScaler):
            value = 'auto'
        out[field.name] = value
    return out


def policy_from_state(state, fname):
    """The :class:`mxmp.Policy` of :func:`policy_state` ``state`` (read from ``fname``);
    ValueError naming the file if it is not one."""
    try:
        return Policy(**state)
    except (TypeError, ValueError) as err:
        raise ValueError('%s holds an invalid policy: %s' % (fname, err)) from None


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
    and the Module keyword arguments (a new dict) with the saved choices where ``kwargs`` has
    none: without a ``policy``, the saved policy (op lists, ``emulate`` as the user chose it,
    resolved again on this machine), in which the ``emulate`` and ``cast_params`` of ``kwargs``
    replace the saved ones; a loss scaler of the saved class and configuration, unless
    ``kwargs`` or the policy sets one of another class (ValueError), or of another
    configuration (ValueError when the Module restores the state). ValueError as
    :meth:`mxmp.Module.load` documents."""
    state_file = '%s-%04d.mxmp.json' % (prefix, epoch)
    kwargs = dict(kwargs)
    if not os.path.exists(state_file):
        return None, state_file, kwargs
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
    policy = kwargs.get('policy')
    if policy is None and isinstance(state.get('policy'), dict):
        policy = policy_from_state(state['policy'], state_file)
        if 'emulate' in kwargs:
            policy = policy.replace(emulate=kwargs.pop('emulate'))
        if kwargs.get('cast_params') is not None:
            policy = policy.replace(param_dtype=policy.target_dtype if kwargs.pop('cast_params')
                                    else 'float32')
        kwargs.pop('target_dtype', None)   # the saved one (checked above)
        kwargs.pop('cast_params', None)
        kwargs['policy'] = policy
    elif policy is None:   # a float32 Module
        for key in ('target_dtype', 'cast_params'):
            if key in state:
                kwargs.setdefault(key, state[key])
    if kwargs.get('loss_scaler') is None:
        try:
            restored = from_state_dict(state.get('loss_scaler'))
        except ValueError as err:
            raise ValueError('%s: %s' % (state_file, err)) from None
        spec = 'auto' if policy is None else policy.loss_scaler
        if isinstance(spec, str) and spec.lower() == 'auto':
            kwargs['loss_scaler'] = restored
        else:
            asked = make_loss_scaler(spec, state['target_dtype'])
            if type(asked) is not type(restored):
                raise ValueError('%s holds the state of a %s but the policy asks for '
                                 'loss_scaler=%r; pass a policy whose loss_scaler agrees, or '
                                 'omit the policy' % (state_file, type(restored).__name__, spec))
            if not isinstance(spec, LossScaler):   # a name: the saved configuration
                kwargs['policy'] = policy.replace(loss_scaler=restored)
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
