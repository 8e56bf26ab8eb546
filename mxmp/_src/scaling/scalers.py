"""Loss scalers: static, dynamic and no-op, as small immutable values.

Loss scaling multiplies the loss by ``S`` before the backward pass so that small gradients stay
representable in float16 (smallest subnormal 2**-24), and divides the gradients by ``S`` before
the update (Micikevicius et al., "Mixed Precision Training", ICLR 2018, section 3.2; NVIDIA,
"Training With Mixed Precision", "Choosing A Scaling Factor"). A *dynamic* scaler halves ``S``
and skips the step on overflow (inf/NaN), and doubles ``S`` after a run of finite steps.

As in google-deepmind/jmp each scaler is a frozen dataclass and :meth:`LossScaler.adjust` is
pure: it returns a *new* scaler, so a scaler is stored, compared and checkpointed like any
value; the owner (:mod:`mxmp._src.training.step`) keeps the current one and replaces it after every
step. Dynamic defaults (2**16, x2 per 2000 finite steps, x0.5 on overflow) as torch's GradScaler.
"""
import dataclasses
import math
from typing import Optional

from ..dtypes import normalize_dtype
from .losses import flatten_losses, scale_losses  # noqa: F401  (part of this API)

__all__ = ['LossScaler', 'NoOpLossScaler', 'StaticLossScaler', 'DynamicLossScaler',
           'make_loss_scaler', 'from_state_dict', 'DEFAULT_STATIC_SCALE', 'scale_losses',
           'flatten_losses']

#: The scale of ``make_loss_scaler('static', ...)``: 2**16, the start value of the dynamic
#: scaler, so that ``'static'`` and ``'dynamic'`` differ only in adaptation. A static scale is
#: never lowered: if 2**16 overflows for your model, pass a smaller number instead.
DEFAULT_STATIC_SCALE = 2.0 ** 16


def _positive_finite(name, value):
    """Return ``value`` as a float; ValueError naming ``name`` unless it is finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError('%s must be a positive finite number, got %r' % (name, value))
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError('%s must be a positive finite number, got %r' % (name, value))
    return value


@dataclasses.dataclass(frozen=True)
class LossScaler:
    """Common base of the loss scalers (an immutable value; never instantiate it directly).

    Every subclass provides:

    * ``scale`` (float): the loss scale ``S``. The loss is multiplied by ``S`` before the
      backward pass and the gradients are divided by ``S`` before the update.
    * ``enabled`` (bool): False only for :class:`NoOpLossScaler`; a disabled scaler means the
      loss is not multiplied at all (not even by 1).
    * ``dynamic`` (bool): True if the scale reacts to overflow. The owner must then check the
      gradients for inf/NaN on every step, skip the update on overflow, and call ``adjust``.
    * ``adjust(finite) -> LossScaler``: the scaler to use for the next step, given whether all
      gradients of this step were finite. Pure: ``self`` is never modified.
    * ``state_dict() -> dict``: JSON-serialisable, with the class name under ``'class'``.
    * ``load_state_dict(d) -> LossScaler``: a new scaler of the same class and configuration
      carrying the saved state. Pure. ValueError if ``d`` is from another class or another
      configuration (the message names the mismatching field).

    Reference: Micikevicius et al., "Mixed Precision Training", ICLR 2018, section 3.2.
    """

    #: Names of the dataclass fields that describe the configuration (checked on load) as
    #: opposed to the running state. Subclasses override.
    _CONFIG_FIELDS = ()
    #: Names of the fields that hold the running state (restored on load).
    _STATE_FIELDS = ()
    #: Fields that may be missing from a saved state (name -> value assumed).
    _OPTIONAL_FIELDS = {}

    def __post_init__(self):
        if type(self) is LossScaler:  # pylint: disable=unidiomatic-typecheck
            raise TypeError('LossScaler is the abstract base; use NoOpLossScaler, '
                            'StaticLossScaler or DynamicLossScaler (or make_loss_scaler)')

    @property
    def enabled(self) -> bool:
        """bool: whether the loss is scaled at all (False only for NoOpLossScaler)."""
        return True

    @property
    def dynamic(self) -> bool:
        """bool: whether the scale changes with overflow (only DynamicLossScaler)."""
        return False

    def adjust(self, finite: bool) -> 'LossScaler':
        """Return the scaler for the next step given whether this step's gradients were finite.

        Args:
            finite (bool): True if every gradient of the step was finite (no inf/NaN).

        Returns:
            LossScaler: a scaler of the same class; ``self`` itself for the static and no-op
            scalers (they never change).
        """
        del finite
        return self

    def state_dict(self) -> dict:
        """Return the scaler as a JSON-serialisable dict: ``{'class': name, <field>: value}``."""
        d = {'class': type(self).__name__}
        for name in self._CONFIG_FIELDS + self._STATE_FIELDS:
            d[name] = getattr(self, name)
        return d

    def load_state_dict(self, state: dict) -> 'LossScaler':
        """Return a new scaler with this configuration and the running state in ``state``.

        Args:
            state (dict): as returned by :meth:`state_dict` of a scaler of the same class and
                configuration.

        Returns:
            LossScaler: a new instance; ``self`` is unchanged.

        Raises:
            ValueError: ``state`` is not a dict, comes from another scaler class, has another
                configuration (the mismatching field is named), misses a key, or holds an
                invalid state (e.g. a scale outside ``[min_scale, max_scale]``).
        """
        if not isinstance(state, dict):
            raise ValueError('loss scaler state must be a dict, got %s' % type(state).__name__)
        cls = state.get('class')
        if cls != type(self).__name__:
            raise ValueError('loss scaler state is for %r but this scaler is %r; create the '
                             'Trainer with the same loss_scaler as the run that saved it'
                             % (cls, type(self).__name__))
        state = dict(self._OPTIONAL_FIELDS, **state)
        for name in self._CONFIG_FIELDS + self._STATE_FIELDS:
            if name not in state:
                raise ValueError('loss scaler state for %s misses the key %r'
                                 % (type(self).__name__, name))
        for name in self._CONFIG_FIELDS:
            mine, theirs = getattr(self, name), state[name]
            if isinstance(theirs, bool) or not isinstance(theirs, (int, float)) or \
                    float(theirs) != float(mine):
                raise ValueError('loss scaler configuration mismatch: %s is %r in the saved '
                                 'state but %r in this %s' % (name, theirs, mine,
                                                              type(self).__name__))
        if not self._STATE_FIELDS:
            return self
        try:
            return dataclasses.replace(self, **{n: state[n] for n in self._STATE_FIELDS})
        except (TypeError, ValueError) as err:
            raise ValueError('invalid loss scaler state %r: %s' % (state, err)) from None


@dataclasses.dataclass(frozen=True)
class NoOpLossScaler(LossScaler):
    """No loss scaling: ``scale`` is 1.0, ``enabled`` is False, every call is a no-op.

    Like PyTorch's ``GradScaler(enabled=False)``: the Trainer does not multiply the loss, does
    not check the gradients for overflow and never skips a step. The default for bfloat16 and
    float32 training: bfloat16 has float32's 8-bit exponent, so gradients that float32
    represents do not underflow in bfloat16 (NVIDIA mixed-precision training guide; Kalamkar
    et al., "A Study of BFLOAT16 for Deep Learning Training", 2019).
    """

    scale: float = dataclasses.field(default=1.0, init=False)

    @property
    def enabled(self) -> bool:
        """bool: always False."""
        return False


@dataclasses.dataclass(frozen=True)
class StaticLossScaler(LossScaler):
    """A constant loss scale.

    Args:
        scale (float): the loss scale ``S``, finite and > 0. Powers of two keep the unscaling
            exact.

    Raises:
        ValueError: ``scale`` is not a positive finite number.

    The Trainer does not check gradients for overflow with a static scale (there is nothing to
    adjust): an inf in a gradient reaches the weights. Choose ``S`` so that the largest
    gradient times ``S`` stays below float16's maximum 65504 (NVIDIA mixed-precision training
    guide, "Choosing A Scaling Factor"), or use :class:`DynamicLossScaler`.
    """

    scale: float = DEFAULT_STATIC_SCALE
    _CONFIG_FIELDS = ('scale',)

    def __post_init__(self):
        object.__setattr__(self, 'scale', _positive_finite('scale', self.scale))


@dataclasses.dataclass(frozen=True)
class DynamicLossScaler(LossScaler):
    """Dynamic loss scaling: back off on overflow, grow after a run of finite steps.

    Args:
        init_scale (float): first loss scale, default 2**16; must lie in
            ``[min_scale, max_scale]``.
        growth_factor (float): factor applied after ``growth_interval`` consecutive finite
            steps, > 1; default 2.
        backoff_factor (float): factor applied on overflow, in (0, 1); default 0.5.
        growth_interval (int): number of consecutive finite steps before growing, >= 1;
            default 2000.
        min_scale (float): floor of the scale, > 0; default 1 (below 1 scaling would shrink
            gradients instead of protecting them).
        max_scale (float): cap of the scale, >= min_scale; default 2**24 (contrib.amp's cap).
        max_overflows_at_floor (int): how many consecutive overflows at ``min_scale`` the
            owner tolerates before it raises :class:`mxmp._src.errors.LossScaleAtFloorError`
            (naming the parameters whose gradients were inf/NaN), >= 0; 0 never raises (the
            behaviour of PyTorch's GradScaler, which skips such steps forever). Default 10:
            at the floor (1 by default, i.e. no scaling) lowering the scale cannot help, so a
            run of skipped steps there means inf/NaN gradients that scaling did not cause (a
            NaN in the forward pass, a too large learning rate, a bad batch); 10 lets a few
            bad batches through and stops a run that would otherwise skip every step while
            reporting success.
        scale (float or None): current scale (state); None means ``init_scale``.
        counter (int): finite steps since the scale last changed (state), in
            ``[0, growth_interval)``; default 0.
        overflows_at_floor (int): consecutive overflows that happened with the scale already
            at ``min_scale`` (state), >= 0; default 0. A finite step resets it.

    Raises:
        ValueError: an argument is out of range; the message names it.

    Rule (:meth:`adjust`), as PyTorch's GradScaler and ``mxnet.contrib.amp``:

    * overflow (``finite=False``): ``scale = max(scale * backoff_factor, min_scale)``,
      ``counter = 0`` (the owner skips the step);
    * finite: ``counter += 1``; when ``counter == growth_interval``:
      ``scale = min(scale * growth_factor, max_scale)`` and ``counter = 0``;
    * ``overflows_at_floor`` counts the overflows of steps that ran at ``scale == min_scale``
      since the last finite step (mxmp's addition; the owners raise at
      ``max_overflows_at_floor``).

    Defaults match ``torch.cuda.amp.GradScaler`` (2**16, 2, 0.5, 2000) and
    ``mxnet/contrib/amp/loss_scaler.py`` (2**16, x2 every 2000 steps, /2, cap 2**24).
    """

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    min_scale: float = 1.0
    max_scale: float = 2.0 ** 24
    max_overflows_at_floor: int = 10
    scale: Optional[float] = None
    counter: int = 0
    overflows_at_floor: int = 0

    _CONFIG_FIELDS = ('init_scale', 'growth_factor', 'backoff_factor', 'growth_interval',
                      'min_scale', 'max_scale', 'max_overflows_at_floor')
    _STATE_FIELDS = ('scale', 'counter', 'overflows_at_floor')
    #: Fields added after the first release: absent from older states, they take their
    #: defaults on load.
    _OPTIONAL_FIELDS = {'max_overflows_at_floor': 10, 'overflows_at_floor': 0}

    def __post_init__(self):
        setf = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        for name in ('init_scale', 'growth_factor', 'backoff_factor', 'min_scale', 'max_scale'):
            setf(name, _positive_finite(name, getattr(self, name)))
        if self.growth_factor <= 1:
            raise ValueError('growth_factor must be > 1, got %r' % self.growth_factor)
        if self.backoff_factor >= 1:
            raise ValueError('backoff_factor must be in (0, 1), got %r' % self.backoff_factor)
        gi = self.growth_interval
        if isinstance(gi, bool) or not isinstance(gi, int) or gi < 1:
            raise ValueError('growth_interval must be an integer >= 1, got %r' % (gi,))
        if self.max_scale < self.min_scale:
            raise ValueError('max_scale (%r) must be >= min_scale (%r)'
                             % (self.max_scale, self.min_scale))
        if not self.min_scale <= self.init_scale <= self.max_scale:
            raise ValueError('init_scale (%r) must lie in [min_scale, max_scale] = [%r, %r]'
                             % (self.init_scale, self.min_scale, self.max_scale))
        if self.scale is None:
            setf('scale', self.init_scale)
        setf('scale', _positive_finite('scale', self.scale))
        if not self.min_scale <= self.scale <= self.max_scale:
            raise ValueError('scale (%r) must lie in [min_scale, max_scale] = [%r, %r]'
                             % (self.scale, self.min_scale, self.max_scale))
        c = self.counter
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < self.growth_interval:
            raise ValueError('counter must be an integer in [0, growth_interval=%d), got %r'
                             % (self.growth_interval, c))
        for name in ('max_overflows_at_floor', 'overflows_at_floor'):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError('%s must be an integer >= 0, got %r' % (name, v))

    @property
    def dynamic(self) -> bool:
        """bool: always True."""
        return True

    def adjust(self, finite: bool) -> 'DynamicLossScaler':
        """Return the scaler for the next step (pure; see the class docstring for the rule).

        Args:
            finite (bool): True if every gradient of the step was finite.

        Returns:
            DynamicLossScaler: a new instance with the updated ``scale`` and ``counter``.
        """
        if not finite:
            at_floor = self.overflows_at_floor + 1 if self.scale <= self.min_scale else 0
            return dataclasses.replace(
                self, scale=max(self.scale * self.backoff_factor, self.min_scale), counter=0,
                overflows_at_floor=at_floor)
        counter = self.counter + 1
        if counter >= self.growth_interval:
            return dataclasses.replace(
                self, scale=min(self.scale * self.growth_factor, self.max_scale), counter=0,
                overflows_at_floor=0)
        return dataclasses.replace(self, counter=counter, overflows_at_floor=0)

    @property
    def stuck_at_floor(self) -> bool:
        """bool: ``overflows_at_floor`` reached ``max_overflows_at_floor`` (never if it is 0)."""
        return 0 < self.max_overflows_at_floor <= self.overflows_at_floor


_SPECS = ("None/'auto' (dynamic for float16, none for bfloat16/float32), 'dynamic', "
          "'static', 'none'/False, a positive number (static scale) or a LossScaler instance")


def make_loss_scaler(spec, target_dtype) -> LossScaler:
    """Build a loss scaler from a short specification.

    Args:
        spec: one of

            * ``None`` or ``'auto'``: :class:`DynamicLossScaler` with the defaults for float16,
              :class:`NoOpLossScaler` for bfloat16 and float32 (bfloat16 has float32's
              exponent range, so gradients do not underflow; NVIDIA mixed-precision guide);
            * ``'dynamic'`` or ``True``: ``DynamicLossScaler()`` (any target dtype);
            * ``'static'``: ``StaticLossScaler(DEFAULT_STATIC_SCALE)`` (2**16);
            * ``'none'`` or ``False``: ``NoOpLossScaler()``;
            * a positive finite number: ``StaticLossScaler(number)``;
            * a :class:`LossScaler` instance: returned unchanged.

            Strings are case-insensitive.
        target_dtype: ``'float16'``, ``'bfloat16'`` or ``'float32'`` (or the numpy /
            ``mxnet.contrib.amp`` dtype objects); decides what ``None``/``'auto'`` means.

    Returns:
        LossScaler

    Raises:
        ValueError: unknown ``spec`` (the message lists the accepted ones) or unknown
            ``target_dtype``.
    """
    dtype = normalize_dtype(target_dtype, allow_float32=True)
    if isinstance(spec, LossScaler):
        return spec
    if spec is None:
        spec = 'auto'
    if isinstance(spec, bool):
        return DynamicLossScaler() if spec else NoOpLossScaler()
    if isinstance(spec, (int, float)):
        try:
            return StaticLossScaler(float(spec))
        except ValueError:
            raise ValueError('a numeric loss_scaler must be a positive finite number (the '
                             'static loss scale), got %r' % (spec,)) from None
    if isinstance(spec, str):
        key = spec.lower()
        if key == 'auto':
            return DynamicLossScaler() if dtype == 'float16' else NoOpLossScaler()
        if key == 'dynamic':
            return DynamicLossScaler()
        if key == 'static':
            return StaticLossScaler(DEFAULT_STATIC_SCALE)
        if key == 'none':
            return NoOpLossScaler()
    raise ValueError('unknown loss_scaler %r; accepted: %s' % (spec, _SPECS))


_CLASSES = {c.__name__: c for c in (NoOpLossScaler, StaticLossScaler, DynamicLossScaler)}


def from_state_dict(state) -> LossScaler:
    """Rebuild the scaler a :meth:`LossScaler.state_dict` came from: class, configuration
    and running state (:meth:`LossScaler.load_state_dict` needs a scaler of the same class).

    Args:
        state (dict): ``{'class': 'DynamicLossScaler', <field>: value, ...}``.

    Returns:
        LossScaler: a new scaler of the saved class.

    Raises:
        ValueError: ``state`` is not a dict naming one of the three scaler classes
            (``'unknown loss scaler state ...'``), or its fields are invalid (``'invalid loss
            scaler state: ...'``, the scaler's own message follows).
    """
    if not isinstance(state, dict) or state.get('class') not in _CLASSES:
        raise ValueError('unknown loss scaler state %r' % (state,))
    cls = _CLASSES[state['class']]
    try:
        return cls(**{k: state[k] for k in cls._CONFIG_FIELDS + cls._STATE_FIELDS if k in state})
    except (TypeError, ValueError) as err:
        raise ValueError('invalid loss scaler state: %s' % err) from None
