"""Checkpoint files of :class:`mxmp.Module` and :class:`mxmp.BucketingModule`: MXNet's own, in
float32, plus ``prefix-%04d.mxmp.json`` (:meth:`mxmp.Module.mixed_precision_state`), all
written atomically."""
import copy
import dataclasses
import json
import os
import pickle

import mxnet as mx
from mxnet import nd

from ..dtypes import is_low_precision, normalize_dtype
from ..errors import mxnet_error_line
from ..policy.policy import Policy
from ..scaling import LossScaler, from_state_dict, make_loss_scaler
from ..files import save_atomic, write_atomic
from ..graph.strip import without_library_ops
from .checkpoint import check_format

__all__ = ['STATES_FORMAT', 'STATES_VERSION', 'write_state', 'restore_state',
           'read_state', 'load_params', 'policy_state', 'policy_from_state',
           'states_by_index', 'saved_graph', 'ModuleCheckpoints']

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
    try:
        restored = from_state_dict(state.get('loss_scaler'))
    except ValueError as err:
        raise ValueError('%s: %s' % (state_file, err)) from None
    given = kwargs.get('loss_scaler')
    if isinstance(given, str) and given.lower() not in ('auto', 'none'):
        # a kind named ('dynamic', 'static'): the saved scaler of that kind, its configuration
        # and state; another kind is refused when the Module restores the state
        if type(make_loss_scaler(given, state['target_dtype'])) is type(restored):
            kwargs['loss_scaler'] = restored
    elif given is None:
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


def states_by_index(updater, names, device_ids, fname):
    """Give the optimizer states ``updater`` (an ``mx.optimizer.Updater``) loaded from
    ``fname`` by parameter name (plain MXNet's kvstore updates: several devices, kvstore
    'local' or 'device') to the index of that parameter on every context, ``i * num_contexts
    + k`` for ``names[i]`` (what the Module's optimizer uses; ``device_ids``: the contexts'),
    update counts included, in place; states by index stay. ValueError naming the file's
    parameters that are not in ``names``."""
    named = {k: v for k, v in updater.states.items() if isinstance(k, str)}
    if not named:
        return
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise ValueError('%s holds optimizer states of parameters this Module does not have: '
                         '%s; load the states saved with this network'
                         % (fname, ', '.join(unknown)))
    num_contexts = len(device_ids)
    optimizer = updater.optimizer
    counts = {k: v for per_device in optimizer._all_index_update_counts.values()
              for k, v in per_device.items() if isinstance(k, str)}
    for per_device in optimizer._all_index_update_counts.values():
        for key in [k for k in per_device if isinstance(k, str)]:
            del per_device[key]
    for i, name in enumerate(names):
        for k, device_id in enumerate(device_ids):
            if name in counts:
                optimizer._all_index_update_counts.setdefault(device_id, {})[
                    i * num_contexts + k] = counts[name]
    states = {k: v for k, v in updater.states.items() if not isinstance(k, str)}
    for i, name in enumerate(names):
        if name in named:
            for k in range(num_contexts):
                states[i * num_contexts + k] = named[name] if k == 0 else \
                    _copy_state(named[name])
    updater.states = states
    updater.states_synced = dict.fromkeys(states, False)


def _copy_state(state):
    """A copy of an optimizer state (None, an NDArray, or a tuple/list of them)."""
    if isinstance(state, nd.NDArray):
        return state.copy()
    if isinstance(state, (tuple, list)):
        return type(state)(_copy_state(s) for s in state)
    return state


def saved_graph(module, remove_amp_cast, library_ops):
    """The JSON (str) of the graph :meth:`Module.save_checkpoint` writes: the float32 network
    (``remove_amp_cast=True``), or the converted graph with its casts and stored dtypes, holding
    MXNet's own ops (plain MXNet loads it) unless ``library_ops=True`` keeps the ops of mxmp's
    library the Module runs (then it loads after ``import mxmp``)."""
    if remove_amp_cast:
        return module.symbol.tojson()
    sym = module._mp_symbol   # the converted graph, without the loss-scale node
    return (sym if library_ops else without_library_ops(sym)).tojson(remove_amp_cast=False)


class ModuleCheckpoints:
    """The checkpoint methods of :class:`mxmp.Module` (a base class before ``mx.mod.Module``):
    MXNet's float32 files, the optimizer states, and ``prefix-%04d.mxmp.json``."""

    def save_optimizer_states(self, fname):
        """Write the optimizer and its states to ``fname`` atomically, as plain MXNet would
        for this Module: by optimizer index on one context (or without a kvstore), by
        parameter name (the first context's, equal on all) on several contexts with a kvstore,
        where plain MXNet updates on its kvstore. The optimizer's ``rescale_grad`` is written
        without the loss scale (the last update divided it by the scale)."""
        assert self.optimizer_initialized
        optimizer = copy.copy(self._optimizer)
        if self._rescale_grad is not None:
            optimizer.rescale_grad = self._rescale_grad
        states, ndev = self._updater.states, len(self._context)
        if ndev > 1 and self._kvstore:
            names = self._exec_group.param_names
            states = {n: states[i * ndev] for i, n in enumerate(names) if i * ndev in states}
            counts = self._optimizer._all_index_update_counts.get(self._context[0].device_id,
                                                                  {})
            counts = {n: counts[i * ndev] for i, n in enumerate(names) if i * ndev in counts}
            optimizer._all_index_update_counts = {0: counts}
            optimizer._index_update_count = counts
        write_atomic(fname, pickle.dumps((states, optimizer)))

    def load_optimizer_states(self, fname):
        """Load what :meth:`save_optimizer_states` or plain MXNet wrote, optimizer included
        when the file has it. Plain MXNet's kvstore (``update_on_kvstore``: several devices
        with kvstore 'local' or 'device') keys the states by parameter name: each is given to
        the optimizer index of that parameter on every context (``i * num_contexts + k``).
        ValueError naming them if the file's names are not this Module's parameters."""
        assert self.optimizer_initialized
        with open(fname, 'rb') as fin:
            self._updater.set_states(fin.read())
        self._optimizer = self._updater.optimizer
        states_by_index(self._updater, self._exec_group.param_names,
                        [ctx.device_id for ctx in self._context], fname)

    def mixed_precision_state(self):
        """dict: what ``prefix-%04d.mxmp.json`` holds (JSON-serialisable): the user's
        choices (target dtype, cast_params, the policy with its op lists and ``emulate`` as
        given, not as this machine resolved it), the loss scaler's state, skipped steps."""
        return {'format': STATES_FORMAT, 'version': STATES_VERSION,
                'target_dtype': self._target_dtype, 'cast_params': self._cast_params,
                'policy': policy_state(self._chosen),
                'loss_scaler': self.loss_scaler.state_dict(),
                'skipped_steps': self.skipped_steps}

    def save_checkpoint(self, prefix, epoch, save_optimizer_states=False, remove_amp_cast=True,
                        library_ops=False):
        """Write ``prefix-symbol.json`` (:func:`saved_graph`), ``prefix-%04d.params``
        (float32), optionally ``-%04d.states``, and ``-%04d.mxmp.json``, atomically."""
        write_atomic('%s-symbol.json' % prefix, saved_graph(self, remove_amp_cast, library_ops))
        param_name = '%s-%04d.params' % (prefix, epoch)
        save_atomic(param_name, self.save_params)
        if save_optimizer_states:
            self.save_optimizer_states('%s-%04d.states' % (prefix, epoch))
        write_state(prefix, epoch, self.mixed_precision_state())
        self.logger.info('Saved checkpoint to "%s" (loss scale %g, %d skipped steps)',
                         param_name, self.loss_scale, self.skipped_steps)

    def checkpoint_callback(self, prefix, period=1, save_optimizer_states=False):
        """An ``epoch_end_callback``: :meth:`save_checkpoint` every ``period`` epochs."""
        return mx.callback.module_checkpoint(self, prefix, period, save_optimizer_states)

    def set_loaded(self, args, auxs, state, state_file):
        """Give this unbound Module loaded parameters and state (None: none)."""
        self._arg_params = {k: v.astype('float32') if is_low_precision(v.dtype) else v
                            for k, v in args.items()}
        self._aux_params = auxs
        self.params_initialized = True
        if state is not None:
            self._step.scaler, self._step.skipped_steps = restore_state(
                self._step.scaler, state, state_file)
            self._write_loss_scale(force=True)

