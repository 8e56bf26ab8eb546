"""Checkpoints of :class:`mxmp.Module` and :class:`mxmp.BucketingModule`: files plain MXNet loads.

A checkpoint is MXNet's own files, in float32, plus one JSON file for what MXNet has no place
for:

* ``prefix-symbol.json``: the float32 symbol (no casts, no loss-scale node);
* ``prefix-%04d.params``: float32 parameters (the master weights when ``cast_params``);
* ``prefix-%04d.states`` (optional): ``Updater.get_states(dump_optimizer=True)``, MXNet's
  optimizer-states format, the optimizer included (its update counts, hence the position of
  the learning-rate schedule, survive a resume even when overflow skipped steps);
* ``prefix-%04d.mxmp.json``: :func:`mixed_precision_state`, the loss scaler (class,
  configuration, running state), skipped steps, target dtype, ``cast_params``, ``emulate``.

Every file is written atomically (:func:`mxmp._src.training.checkpoint.write_atomic`).
``mx.model.load_checkpoint`` and ``mx.mod.Module.load`` read the first three;
:func:`load_module` reads all four, and plain MXNet checkpoints (no JSON file) too. The
functions take the Module as first argument; the Module's methods of the same names call them.
"""
import json
import os

import mxnet as mx
from mxnet import nd

from ..dtypes import is_low_precision, normalize_dtype
from ..errors import mxnet_error_line
from ..scaling.scalers import from_state_dict
from .checkpoint import save_atomic, write_atomic

__all__ = ['STATES_FORMAT', 'STATES_VERSION', 'save_optimizer_states', 'load_optimizer_states',
           'mixed_precision_state', 'write_mixed_precision_state', 'save_checkpoint',
           'checkpoint_callback', 'restore_state', 'read_state', 'float32_params',
           'load_params', 'set_loaded_params', 'load_module']

#: ``format`` field of ``prefix-%04d.mxmp.json``.
STATES_FORMAT = 'mxmp.Module'
#: ``version`` field of ``prefix-%04d.mxmp.json``: the one this mxmp writes and reads.
STATES_VERSION = 1


def save_optimizer_states(module, fname):
    """Save the optimizer and its states (atomically), in a format plain MXNet reads.

    The file is ``Updater.get_states(dump_optimizer=True)``: the states (for a
    low-precision parameter, those of its float32 master weight) and the optimizer itself,
    so that its update counts, hence the learning-rate schedule's position, survive a
    resume even when overflow skipped some steps. ``mx.mod.Module.load_optimizer_states``
    reads it too. The master weights are the float32 parameters (``get_params``,
    ``save_params``, ``save_checkpoint``), not part of this file.

    Args:
        fname (str): the file to write (``module``: the :class:`mxmp.Module`, when called as
            a function).
    """
    write_atomic(fname, module._updater.get_states(dump_optimizer=True))


def load_optimizer_states(module, fname):
    """Load what :meth:`save_optimizer_states` (or plain MXNet's) wrote.

    A file holding the optimizer replaces the installed one (update counts and schedule
    included); ``rescale_grad`` stays ``1/batch_size`` of this Module.

    Args:
        fname (str): the file to read (``module``: the :class:`mxmp.Module`, when called as a
            function).
    """
    with open(fname, 'rb') as fin:
        module._updater.set_states(fin.read())
    module._optimizer = module._updater.optimizer


def mixed_precision_state(module):
    """dict: what ``prefix-%04d.mxmp.json`` holds (JSON-serialisable)."""
    policy = module.policy
    return {'format': STATES_FORMAT, 'version': STATES_VERSION,
            'target_dtype': module.target_dtype, 'cast_params': module.cast_params,
            'emulate': bool(policy is not None and policy.emulate is True),
            'loss_scaler': module.loss_scaler.state_dict(),
            'skipped_steps': module.skipped_steps}


def write_mixed_precision_state(module, prefix, epoch):
    """Write ``prefix-%04d.mxmp.json`` (atomically) from :func:`mixed_precision_state`."""
    write_atomic('%s-%04d.mxmp.json' % (prefix, epoch),
                 json.dumps(mixed_precision_state(module), indent=1, sort_keys=True))


def save_checkpoint(module, prefix, epoch, save_optimizer_states=False, remove_amp_cast=True):
    """Save a checkpoint that plain MXNet loads, plus the loss-scaling state.

    Files: ``prefix-symbol.json`` (the float32 symbol: no casts, no loss-scale node; with
    ``remove_amp_cast=False`` the mixed-precision graph with its casts, still without
    the loss-scale node), ``prefix-%04d.params`` (float32: the master weights when
    ``cast_params``), optionally ``prefix-%04d.states`` (MXNet's optimizer-state
    format), and ``prefix-%04d.mxmp.json`` (loss scaler state and configuration,
    skipped steps, target dtype), each written atomically.

    Args:
        prefix (str): file prefix.
        epoch (int): number in the file names.
        save_optimizer_states (bool): also write the optimizer states.
        remove_amp_cast (bool): see above; default True.
        (``module``: the :class:`mxmp.Module`, when called as a function.)
    """
    sym = module.symbol if remove_amp_cast else module._mp_symbol
    write_atomic('%s-symbol.json' % prefix, sym.tojson(remove_amp_cast=remove_amp_cast))
    param_name = '%s-%04d.params' % (prefix, epoch)
    arg_params, aux_params = module.get_params()
    save = {'arg:%s' % k: v.as_in_context(mx.cpu()) for k, v in arg_params.items()}
    save.update({'aux:%s' % k: v.as_in_context(mx.cpu()) for k, v in aux_params.items()})
    save_atomic(param_name, lambda tmp: nd.save(tmp, save))
    if save_optimizer_states:
        module.save_optimizer_states('%s-%04d.states' % (prefix, epoch))
    write_mixed_precision_state(module, prefix, epoch)
    module.logger.info('Saved checkpoint to "%s" (loss scale %g, %d skipped steps)',
                       param_name, module.loss_scale, module.skipped_steps)


def checkpoint_callback(module, prefix, period=1, save_optimizer_states=False):
    """An ``epoch_end_callback`` for ``fit`` that calls :meth:`save_checkpoint`.

    Unlike ``mx.callback.do_checkpoint`` it also saves the loss-scaling state.

    Args:
        prefix (str): file prefix.
        period (int): save every ``period`` epochs (epoch numbers start at 1 in the
            file names, as MXNet's callback).
        save_optimizer_states (bool): also save the optimizer states.
        (``module``: the :class:`mxmp.Module`, when called as a function.)
    """
    period = int(max(1, period))

    def _callback(iter_no, sym=None, arg=None, aux=None):   # pylint: disable=unused-argument
        if (iter_no + 1) % period == 0:
            module.save_checkpoint(prefix, iter_no + 1, save_optimizer_states)
    return _callback


def restore_state(scaler, state, fname):
    """The loss scaler and skipped steps that a read ``prefix-%04d.mxmp.json`` holds.

    Args:
        scaler (mxmp.LossScaler): the Module's scaler; the saved state must match its
            class and configuration.
        state (dict): the file's content.
        fname (str): the file's name, for messages.

    Returns:
        tuple ``(scaler, skipped_steps)``.

    Raises:
        ValueError: not a state file of this format/version, a missing field, or a state that
            does not match ``scaler``.
    """
    if not isinstance(state, dict) or state.get('format') != STATES_FORMAT:
        raise ValueError('%s is not an mxmp.Module state file' % fname)
    if state.get('version') != STATES_VERSION:
        raise ValueError('%s has format version %r; this mxmp reads version %d'
                         % (fname, state.get('version'), STATES_VERSION))
    try:
        return scaler.load_state_dict(state['loss_scaler']), int(state['skipped_steps'])
    except (KeyError, TypeError) as err:
        raise ValueError('%s misses a field: %s' % (fname, err)) from None
    except ValueError as err:
        raise ValueError('%s: %s' % (fname, err)) from None


def read_state(prefix, epoch, kwargs):
    """Read ``prefix-%04d.mxmp.json`` (if any) and fill in the Module keyword arguments.

    Returns ``(state or None, state file name, kwargs)``: without ``loss_scaler`` /
    ``target_dtype`` / ``cast_params`` / ``emulate`` in ``kwargs``, the saved ones are used.
    Raises ValueError as :meth:`mxmp.Module.load` documents.
    """
    kwargs = dict(kwargs)
    state_file = '%s-%04d.mxmp.json' % (prefix, epoch)
    state = None
    if os.path.exists(state_file):
        with open(state_file, 'r', encoding='utf-8') as fin:
            try:
                state = json.load(fin)
            except ValueError as err:
                raise ValueError('%s is not valid JSON: %s' % (state_file, err)) from None
        if not isinstance(state, dict):
            raise ValueError('%s is not an mxmp.Module state file' % state_file)
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
            kwargs['loss_scaler'] = _scaler_from_state(state.get('loss_scaler'), state_file)
    return state, state_file, kwargs


def _scaler_from_state(state, fname):
    """Rebuild the saved loss scaler (class, configuration and running state)."""
    try:
        return from_state_dict(state)
    except ValueError as err:
        raise ValueError('%s: %s' % (fname, err)) from None


def float32_params(params):
    """Parameters as stored for a Module: low-precision ones widened to float32."""
    return {k: v.astype('float32') if is_low_precision(v.dtype) else v
            for k, v in params.items()}


def load_params(prefix, epoch, with_symbol):
    """``mx.model.load_checkpoint`` (``with_symbol``) or ``mx.model.load_params``, with a clear
    error: returns ``(symbol, args, auxs)`` (``symbol`` None without ``with_symbol``).

    Raises:
        ValueError: a truncated or corrupt file (the message says to load an earlier epoch).
    """
    try:
        if with_symbol:
            return mx.model.load_checkpoint(prefix, epoch)
        return (None,) + tuple(mx.model.load_params(prefix, epoch))
    except mx.base.MXNetError as err:
        files = ('%s-symbol.json / %s-%04d.params' % (prefix, prefix, epoch) if with_symbol
                 else '%s-%04d.params' % (prefix, epoch))
        raise ValueError('the checkpoint %s cannot be read: truncated or corrupt (%s); load an '
                         'earlier epoch' % (files, mxnet_error_line(err, 200))) from None


def set_loaded_params(module, args, auxs, state, state_file):
    """Give an unbound ``module`` the loaded parameters (float32) and the saved state."""
    module._arg_params = float32_params(args)
    module._aux_params = auxs
    module.params_initialized = True
    if state is not None:
        module._restore_state(state, state_file)


def load_module(module_cls, prefix, epoch, load_optimizer_states, kwargs):
    """Create a Module from a checkpoint (mxmp's, or plain MXNet's).

    Args:
        prefix (str): file prefix (``prefix-symbol.json``, ``prefix-%04d.params``, and
            optionally ``prefix-%04d.states`` and ``prefix-%04d.mxmp.json``).
        epoch (int): the epoch number in the file names.
        load_optimizer_states (bool): load ``prefix-%04d.states`` at ``init_optimizer``.
        **kwargs: as for :class:`mxmp.Module`. Without ``loss_scaler`` / ``target_dtype`` /
            ``cast_params`` / ``emulate``, those saved in ``prefix-%04d.mxmp.json`` are used
            (a plain MXNet checkpoint has none: the defaults apply). With a
            ``loss_scaler``, the saved state must match its class and configuration.
        (As a function: ``module_cls`` is the class to create, ``kwargs`` a dict.)

    Returns:
        Module: parameters set (float32 from the file), not bound.

    Raises:
        ValueError: the state file is malformed (not JSON, truncated), does not match
            ``loss_scaler``, or was written with another target dtype than the
            ``target_dtype``/``policy`` asked for (the message names the fix).
            Also when ``prefix-%04d.params`` or the symbol file is truncated or corrupt.
        OSError: a file cannot be read.
    """
    sym, args, auxs = load_params(prefix, epoch, with_symbol=True)
    state, state_file, kwargs = read_state(prefix, epoch, kwargs)
    mod = module_cls(sym, **kwargs)
    set_loaded_params(mod, args, auxs, state, state_file)
    if load_optimizer_states:
        mod._preload_opt_states = '%s-%04d.states' % (prefix, epoch)
    return mod
