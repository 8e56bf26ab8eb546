"""The loss scaler :func:`mxmp.amp.init_trainer` gives a ``gluon.Trainer``, with the fields of
contrib.amp 1.9.1's ``LossScaler`` (``mxnet/contrib/amp/loss_scaler.py``) that training code
reads, pickles and writes: ``_loss_scale``, ``_next_loss_scale``, ``_unskipped``,
``_scale_seq_len``, ``_max_loss_scale`` and ``loss_scale``. They are views of mxmp's scaler
(:class:`mxmp.DynamicLossScaler`): reading gives the live value, writing changes the scaler
the next step uses. Meanings and the one difference (no one-step lag): docs/from_contrib_amp.md.
"""
import dataclasses
import logging
import math
import numbers
import warnings

import numpy as np
from mxnet import autograd

from ..scaling import DynamicLossScaler, LossScaleGroup
from ..training.step import Step, flags_finite, param_grads, warn_forward_nonfinite

__all__ = ['TrainerLossScaler', 'CONTRIB_FIELDS']

logger = logging.getLogger('mxmp.amp')

#: contrib.amp's LossScaler fields (and mxmp's view of each) that user code touches.
CONTRIB_FIELDS = ('_loss_scale', '_next_loss_scale', '_unskipped', '_scale_seq_len',
                  '_max_loss_scale')
_DEFAULTS = DynamicLossScaler()   # contrib.amp's values: 2**16, x2 per 2000, cap 2**24


def _number(name, value, integer=False, positive=True):
    """``value`` (any real number, numpy's included; not a bool) as a float (int with
    ``integer``); ValueError naming ``name`` unless finite and > 0 (>= 0 unless
    ``positive``)."""
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Real) and \
        math.isfinite(value) and (value > 0 if positive else value >= 0)
    if integer:
        ok = ok and float(value) == int(value)
    if not ok:
        raise ValueError('%s must be a %s finite %s, got %r'
                         % (name, 'positive' if positive else 'non-negative',
                            'integer' if integer else 'number', value))
    return int(value) if integer else float(value)


class TrainerLossScaler(Step):
    """The :class:`Step` in ``trainer._amp_loss_scaler``: ``gluon.Trainer._update`` (MXNet
    1.9.1) asks :meth:`has_overflow` before each update, and contrib.amp's fields are
    properties over ``self.scaler`` (a :class:`mxmp.LossScaler`).

    Setting any other attribute raises AttributeError (contrib.amp's object would accept it
    and do nothing with it). With scaling off (:class:`mxmp.NoOpLossScaler`, bfloat16's
    default) the scale reads 1.0 and ``_unskipped`` 0; writing those values is accepted, other
    scales raise ValueError naming the fix; ``_scale_seq_len``/``_max_loss_scale`` are kept
    and read back, with a UserWarning that they take effect only when scaling is on.

    Every value contrib.amp's fields take is accepted (any positive finite scale and cap,
    any count): a scale below mxmp's floor (``min_scale``) lowers the floor to it, a cap
    below the scale caps it at the next growth (contrib.amp's ``min(cap, 2 * scale)``), an
    ``_unskipped`` at or above ``_scale_seq_len`` grows the scale at the next finite step.
    The object pickles (:meth:`__getstate__`), as contrib.amp's does.
    """

    def __init__(self, scaler, owner=None):
        super().__init__(scaler, owner)
        self._next = None   # a written _next_loss_scale, applied at the next check
        self._off = {'_scale_seq_len': _DEFAULTS.growth_interval,
                     '_max_loss_scale': _DEFAULTS.max_scale}   # kept while scaling is off
        self._sealed = True   # from now on: only existing attributes and the properties

    # ------------------------------------------------------------------ pickling
    def __getstate__(self):
        """What a pickle keeps (contrib.amp's LossScaler pickles; the group's weak references
        cannot): the scaler, a written ``_next_loss_scale``, the fields kept while scaling
        is off and ``skipped_steps``. The step in progress (losses, stage) is not kept."""
        return {'scaler': self.scaler, 'next': self._next, 'off': dict(self._off),
                'skipped_steps': self.skipped_steps}

    def __setstate__(self, state):
        object.__setattr__(self, '_sealed', False)
        Step.__init__(self, LossScaleGroup(state['scaler']))
        self._next, self._off = state['next'], dict(state['off'])
        self.skipped_steps = state['skipped_steps']
        self._sealed = True

    def __setattr__(self, name, value):
        if self.__dict__.get('_sealed') and name not in self.__dict__ and \
                not isinstance(getattr(type(self), name, None), property):
            raise AttributeError(
                "mxmp.amp's loss scaler has no attribute %r to set: contrib.amp's fields are "
                '%s (and loss_scale, read-only); mxmp.Trainer(loss_scaler=...) or '
                'amp.init(mxmp.Policy(..., loss_scaler=...)) configures the rest'
                % (name, ', '.join(CONTRIB_FIELDS)))
        object.__setattr__(self, name, value)

    @property
    def loss_scale(self):
        """float: the scale the next ``scale_loss`` multiplies by (1.0 when scaling is off)."""
        return float(self.scaler.scale)   # NoOpLossScaler's scale is 1.0

    # ------------------------------------------------------------------ contrib.amp's fields
    def _replace(self, field, **changes):
        """Replace fields of the (dynamic or static) scaler; ValueError naming ``field``."""
        try:
            self.scaler = dataclasses.replace(self.scaler, **changes)
        except ValueError as err:
            raise ValueError('%s: %s' % (field, err)) from None

    def _scale_off(self, field, value):
        """Writing a scale while scaling is off: 1.0 is the state already; else ValueError."""
        if value != 1.0:
            raise ValueError(
                '%s=%r: loss scaling is off for this Trainer (mxmp\'s default for bfloat16, '
                'whose exponent range is float32\'s, or the policy\'s loss_scaler), so its '
                'scale is 1.0. To scale, turn it on before init_trainer: '
                'amp.init(mxmp.Policy(target_dtype, loss_scaler=\'dynamic\'))' % (field, value))

    @property
    def _loss_scale(self):
        """float: the scale of the next step (contrib.amp: ``loss_scale``)."""
        return float(self.scaler.scale)

    def _with_scale(self, value):
        """Changes making ``value`` a valid scale: contrib.amp's scale has no floor, so a
        value below mxmp's ``min_scale`` lowers the floor to it."""
        if self.scaler.dynamic and value < self.scaler.min_scale:
            return {'scale': value, 'min_scale': value}
        return {'scale': value}

    @_loss_scale.setter
    def _loss_scale(self, value):
        value = _number('_loss_scale', value)
        if not self.scaler.enabled:
            self._scale_off('_loss_scale', value)
            return
        if self._next is None:   # contrib.amp: _next_loss_scale keeps its value
            self._next = float(self.scaler.scale)
        self._replace('_loss_scale', **self._with_scale(value))

    @property
    def _next_loss_scale(self):
        """float: the scale from the next overflow check on (it is then halved on overflow or
        doubled after ``_scale_seq_len`` finite steps); equals ``_loss_scale`` unless written."""
        return float(self.scaler.scale) if self._next is None else self._next

    @_next_loss_scale.setter
    def _next_loss_scale(self, value):
        value = _number('_next_loss_scale', value)
        if not self.scaler.enabled:
            self._scale_off('_next_loss_scale', value)
            return
        changes = self._with_scale(value)
        if 'min_scale' in changes:   # the floor now, so that the check can apply it
            self._replace('_next_loss_scale', min_scale=value)
        self._next = None if value == self.scaler.scale else value

    @property
    def _unskipped(self):
        """int: finite steps since the scale last changed (``counter``; 0 unless dynamic)."""
        return int(self.scaler.counter) if self.scaler.dynamic else 0

    @_unskipped.setter
    def _unskipped(self, value):
        value = _number('_unskipped', value, integer=True, positive=False)
        if self.scaler.dynamic:
            self._replace('_unskipped', counter=value)
        elif value != 0:
            raise ValueError('_unskipped=%d: this Trainer\'s loss scale is not dynamic, it '
                             'counts no steps (0)' % value)

    def _config(self, field, attr, value):
        if self.scaler.dynamic:
            self._replace(field, **{attr: value})
            return
        self._off[field] = value
        warnings.warn('%s=%r is kept but changes nothing: this Trainer\'s loss scale is not '
                      'dynamic (%s). For dynamic loss scaling give amp.init an '
                      'mxmp.Policy(target_dtype, loss_scaler=\'dynamic\')'
                      % (field, value, type(self.scaler).__name__), UserWarning, stacklevel=3)

    @property
    def _scale_seq_len(self):
        """int: finite steps after which the scale doubles (``growth_interval``)."""
        return int(self.scaler.growth_interval) if self.scaler.dynamic else \
            self._off['_scale_seq_len']

    @_scale_seq_len.setter
    def _scale_seq_len(self, value):
        self._config('_scale_seq_len', 'growth_interval',
                     _number('_scale_seq_len', value, integer=True))

    @property
    def _max_loss_scale(self):
        """float: the cap of the scale (``max_scale``)."""
        return float(self.scaler.max_scale) if self.scaler.dynamic else \
            self._off['_max_loss_scale']

    @_max_loss_scale.setter
    def _max_loss_scale(self, value):
        value = _number('_max_loss_scale', value)
        if not self.scaler.dynamic:
            self._config('_max_loss_scale', 'max_scale', value)
            return
        # contrib.amp caps the scale at its next growth only: the current scale may stay
        # above the cap; mxmp's start value (init_scale) and floor follow the cap down
        self._replace('_max_loss_scale', max_scale=value,
                      init_scale=min(self.scaler.init_scale, value),
                      min_scale=min(self.scaler.min_scale, value))

    # ------------------------------------------------------------------ the check
    def has_overflow(self, params):
        """True (skip the step) if a gradient on any device is inf/NaN; adjusts the scale.

        A written ``_next_loss_scale`` becomes the scale first (as contrib.amp). Static and
        disabled scalers never check (as :class:`mxmp.Trainer`). A skipped step whose losses
        (of every ``scale_loss`` since the last step) were inf/NaN warns
        :class:`mxmp.NonFiniteForwardWarning`, as :class:`mxmp.Trainer`.
        """
        if self._next is not None:
            self.scaler, self._next = dataclasses.replace(self.scaler, scale=self._next), None
        per_device = {}
        for param in params:
            for k, grad in enumerate(param_grads([param])):
                per_device.setdefault(k, []).append(grad)
        with autograd.pause():
            finite = self.check(list(per_device.values()))
        if not finite and self._loss_flags and not flags_finite(list(self._loss_flags.values())):
            warn_forward_nonfinite(stacklevel=5)   # user code -> step -> _update -> here
        self.end(finite)
        if not finite:
            logger.info('mxmp.amp: overflow, step skipped; loss scale now %g', self.loss_scale)
        return not finite
