"""Loss scaling (Micikevicius et al., "Mixed Precision Training", ICLR 2018, section 3.2): the
loss scalers (frozen values: :meth:`LossScaler.adjust` returns a new one), the
:class:`LossScaleGroup` that holds the current scaler of one or more Trainers, and the
multiplication of (nested) losses. Reasons and sources: docs/training.md.
"""
import dataclasses
import math
import weakref
from typing import Optional

from mxnet import nd

from .dtypes import LOW_PRECISION_DTYPES, dtype_name, mx_dtype, normalize_dtype

__all__ = ['LossScaler', 'NoOpLossScaler', 'StaticLossScaler', 'DynamicLossScaler',
           'make_loss_scaler', 'from_state_dict', 'DEFAULT_STATIC_SCALE', 'LossScaleGroup',
           'scale_losses', 'flatten_losses', 'multiply', 'divide', 'cast_keeping_storage']

#: The scale of ``make_loss_scaler('static', ...)``: 2**16, the dynamic scaler's start value.
DEFAULT_STATIC_SCALE = 2.0 ** 16


def _positive_finite(name, value):
    """Return ``value`` as a float; ValueError naming ``name`` unless it is finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise ValueError('%s must be a positive finite number, got %r' % (name, value))
    return float(value)


def _integer(value, low, high=None):
    """Whether ``value`` is an int (not a bool) in ``[low, high)``."""
    return not isinstance(value, bool) and isinstance(value, int) and value >= low and \
        (high is None or value < high)


def _require(condition, message, *args):
    """ValueError(``message % args``) unless ``condition``."""
    if not condition:
        raise ValueError(message % args)


@dataclasses.dataclass(frozen=True)
class LossScaler:
    """Common base of the loss scalers (an immutable value; TypeError if instantiated): every
    one has ``scale`` (float), ``enabled`` (bool: the loss is scaled at all; False only for
    NoOpLossScaler), ``dynamic`` (bool: the scale changes with overflow and the owner checks
    gradients on every step; only DynamicLossScaler) and the pure ``adjust``, ``state_dict``
    and ``load_state_dict``."""

    enabled = True
    dynamic = False
    _CONFIG_FIELDS = ()     # configuration fields, checked on load
    _STATE_FIELDS = ()      # running state, restored on load

    def __post_init__(self):
        if type(self) is LossScaler:  # pylint: disable=unidiomatic-typecheck
            raise TypeError('LossScaler is the abstract base; use NoOpLossScaler, '
                            'StaticLossScaler or DynamicLossScaler (or make_loss_scaler)')

    def adjust(self, finite: bool) -> 'LossScaler':
        """The scaler for the next step given whether this step's gradients were all finite
        (``finite``, bool); ``self`` for the static and no-op scalers."""
        del finite
        return self

    def state_dict(self) -> dict:
        """Return the scaler as a JSON-serialisable dict: ``{'class': name, <field>: value}``."""
        fields = self._CONFIG_FIELDS + self._STATE_FIELDS
        return {'class': type(self).__name__, **{n: getattr(self, n) for n in fields}}

    def load_state_dict(self, state: dict) -> 'LossScaler':
        """A new scaler with this configuration and the running state in ``state`` (from
        :meth:`state_dict` of a scaler of the same class and configuration); ValueError
        naming the field if it is not, misses a key or holds an invalid state."""
        if not isinstance(state, dict):
            raise ValueError('loss scaler state must be a dict, got %s' % type(state).__name__)
        cls = state.get('class')
        if cls != type(self).__name__:
            raise ValueError('loss scaler state is for %r but this scaler is %r; create the '
                             'Trainer with the same loss_scaler as the run that saved it'
                             % (cls, type(self).__name__))
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
        saved = {n: state[n] for n in self._STATE_FIELDS}
        return from_state_dict(dict(self.state_dict(), **saved))


@dataclasses.dataclass(frozen=True)
class NoOpLossScaler(LossScaler):
    """No loss scaling: ``scale`` is 1.0, ``enabled`` is False (as ``GradScaler(enabled=False)``):
    no multiply, no overflow check, no skipped step. The default for bfloat16 and float32."""

    scale: float = dataclasses.field(default=1.0, init=False)
    enabled = False


@dataclasses.dataclass(frozen=True)
class StaticLossScaler(LossScaler):
    """A constant loss scale ``scale`` (float, finite and > 0, else ValueError; powers of two
    unscale exactly); gradients are not checked for overflow."""

    scale: float = DEFAULT_STATIC_SCALE
    _CONFIG_FIELDS = ('scale',)

    def __post_init__(self):
        object.__setattr__(self, 'scale', _positive_finite('scale', self.scale))


@dataclasses.dataclass(frozen=True)
class DynamicLossScaler(LossScaler):
    """Dynamic loss scaling: back off on overflow, grow after a run of finite steps.

    Args:
        init_scale (float): first loss scale, in ``[min_scale, max_scale]``; default 2**16.
        growth_factor (float): factor after ``growth_interval`` finite steps, > 1; default 2.
        backoff_factor (float): factor on overflow, in (0, 1); default 0.5.
        growth_interval (int): consecutive finite steps before growing, >= 1; default 2000.
        min_scale (float): floor of the scale, > 0; default 1.
        max_scale (float): cap of the scale, >= min_scale; default 2**24 (contrib.amp's cap).
        max_overflows_at_floor (int): consecutive overflows at ``min_scale`` after which the
            owner raises :class:`mxmp.LossScaleAtFloorError`, >= 0; 0 never raises (torch's
            behaviour); default 10.
        scale (float or None): current scale (state), >= ``min_scale``; None means
            ``init_scale``. Above ``max_scale`` only when set so (contrib.amp's fields allow
            it): the next growth then caps it, as contrib.amp's ``min(cap, 2 * scale)``.
        counter (int): finite steps since the scale last changed (state), >= 0; default 0;
            at or above ``growth_interval`` (set so) the scale grows at the next finite step.
        overflows_at_floor (int): consecutive overflows with the scale already at
            ``min_scale`` (state), >= 0; default 0; a finite step resets it.

    ValueError naming an argument out of range. Rule (:meth:`adjust`), as torch's GradScaler
    and ``mxnet.contrib.amp``: on overflow ``scale = max(scale * backoff_factor, min_scale)``,
    ``counter = 0``; on a finite step ``counter += 1`` and at ``growth_interval``: ``scale =
    min(scale * growth_factor, max_scale)``, ``counter = 0``.
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
    dynamic = True

    def __post_init__(self):
        setf = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        for name in ('init_scale', 'growth_factor', 'backoff_factor', 'min_scale', 'max_scale'):
            setf(name, _positive_finite(name, getattr(self, name)))
        _require(self.growth_factor > 1, 'growth_factor must be > 1, got %r', self.growth_factor)
        _require(self.backoff_factor < 1, 'backoff_factor must be in (0, 1), got %r',
                 self.backoff_factor)
        _require(_integer(self.growth_interval, 1),
                 'growth_interval must be an integer >= 1, got %r', self.growth_interval)
        _require(self.max_scale >= self.min_scale, 'max_scale (%r) must be >= min_scale (%r)',
                 self.max_scale, self.min_scale)
        setf('scale', _positive_finite('scale', self.init_scale if self.scale is None
                                       else self.scale))
        _require(self.min_scale <= self.init_scale <= self.max_scale,
                 'init_scale (%r) must lie in [min_scale, max_scale] = [%r, %r]',
                 self.init_scale, self.min_scale, self.max_scale)
        _require(self.min_scale <= self.scale, 'scale (%r) must be >= min_scale (%r)',
                 self.scale, self.min_scale)
        _require(_integer(self.counter, 0), 'counter must be an integer >= 0, got %r',
                 self.counter)
        for name in ('max_overflows_at_floor', 'overflows_at_floor'):
            _require(_integer(getattr(self, name), 0), '%s must be an integer >= 0, got %r',
                     name, getattr(self, name))

    def adjust(self, finite: bool) -> 'DynamicLossScaler':
        """A new scaler with ``scale``, ``counter`` and ``overflows_at_floor`` updated by the
        rule of the class docstring (``finite``: every gradient of the step was finite)."""
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


def make_loss_scaler(spec, target_dtype) -> LossScaler:
    """Build a loss scaler from a short specification.

    Args:
        spec: None or ``'auto'`` (:class:`DynamicLossScaler` for float16,
            :class:`NoOpLossScaler` for bfloat16 and float32, whose exponent ranges agree);
            ``'dynamic'``/True; ``'static'`` (``StaticLossScaler(DEFAULT_STATIC_SCALE)``);
            ``'none'``/False; a positive finite number (static scale); a :class:`LossScaler`
            (returned unchanged). Strings are case-insensitive.
        target_dtype: ``'float16'``, ``'bfloat16'`` or ``'float32'`` (or numpy / contrib.amp
            dtype objects); decides what None/``'auto'`` means.

    Raises:
        ValueError: unknown ``spec`` (the message lists the accepted ones) or ``target_dtype``.
    """
    dtype = normalize_dtype(target_dtype, allow_float32=True)
    if isinstance(spec, LossScaler):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        try:
            return StaticLossScaler(float(spec))
        except ValueError:
            raise ValueError('a numeric loss_scaler must be a positive finite number (the '
                             'static loss scale), got %r' % (spec,)) from None
    key = {None: 'auto', True: 'dynamic', False: 'none'}[spec] if spec is None or \
        isinstance(spec, bool) else spec.lower() if isinstance(spec, str) else None
    made = {'dynamic': DynamicLossScaler, 'static': StaticLossScaler, 'none': NoOpLossScaler,
            'auto': DynamicLossScaler if dtype == 'float16' else NoOpLossScaler}.get(key)
    if made is not None:
        return made()
    raise ValueError("unknown loss_scaler %r; accepted: None/'auto' (dynamic for float16, none "
                     "for bfloat16/float32), 'dynamic', 'static', 'none'/False, a positive "
                     "number (static scale) or a LossScaler instance" % (spec,))


_CLASSES = {c.__name__: c for c in (NoOpLossScaler, StaticLossScaler, DynamicLossScaler)}


def from_state_dict(state) -> LossScaler:
    """The scaler a :meth:`LossScaler.state_dict` came from; ValueError ``'unknown loss scaler
    state ...'`` (no scaler class named) or ``'invalid loss scaler state: ...'`` otherwise."""
    if not isinstance(state, dict) or state.get('class') not in _CLASSES:
        raise ValueError('unknown loss scaler state %r' % (state,))
    cls = _CLASSES[state['class']]
    try:
        return cls(**{k: state[k] for k in cls._CONFIG_FIELDS + cls._STATE_FIELDS if k in state})
    except (TypeError, ValueError) as err:
        raise ValueError('invalid loss scaler state: %s' % err) from None


class LossScaleGroup:
    """One loss scale shared by the Trainers given it as ``loss_scaler``, as one torch
    ``GradScaler`` used by several optimizers: each member skips only its own update on
    overflow; :attr:`current` (LossScaler) changes once every live member has stepped since the
    last change (``adjust(False)`` if any overflowed); a member stepping twice first raises
    RuntimeError. ``scaler`` (LossScaler): the starting scaler; TypeError otherwise.
    """

    def __init__(self, scaler):
        if not isinstance(scaler, LossScaler):
            raise TypeError('LossScaleGroup takes a LossScaler, got %r' % (scaler,))
        self.current = scaler
        self._members = weakref.WeakSet()   # the members, held weakly
        self._stepped = weakref.WeakSet()   # members that stepped in this iteration
        self._finite = True                 # no member overflowed in this iteration

    def join(self, member):
        """Add ``member`` (held through a weak reference)."""
        self._members.add(member)

    def check_can_step(self, member, describe):
        """Raise RuntimeError if ``member`` already stepped in this iteration of the group; the
        message names each member that has not stepped yet by ``describe(member)`` (str)."""
        if member not in self._stepped:
            return
        waiting = [m for m in self._members if m not in self._stepped]
        raise RuntimeError(
            'this Trainer shares its loss scale with %d other Trainer(s) and has already '
            'stepped in this iteration, while %d of them have not (%s). The shared scale '
            'changes once per iteration, after every member of the LossScaleGroup has stepped '
            'once (as torch: scaler.step(opt) for each optimizer, then one scaler.update()). '
            'Step every Trainer once per iteration, or give Trainers that step at different '
            'rates their own loss scaler objects instead of one group.'
            % (len(self._members) - 1, len(waiting), ', '.join(describe(m) for m in waiting)))

    def stepped(self, member, finite):
        """Record that ``member`` stepped (``finite``: its gradients had no inf/NaN); adjust
        :attr:`current` once every member has. Returns whether the scale was adjusted."""
        self._stepped.add(member)
        self._finite = self._finite and bool(finite)
        if any(m not in self._stepped for m in self._members):
            return False
        self.current = self.current.adjust(self._finite)
        self._stepped, self._finite = weakref.WeakSet(), True
        return True


def _walk(loss, leaf, path='loss'):
    """Apply ``leaf`` to every NDArray of a (nested) list/tuple, keeping the nesting: a list
    or tuple stays one, any other sequence (a namedtuple, which cannot be rebuilt from its
    elements) becomes a list."""
    if isinstance(loss, (list, tuple)):
        items = [_walk(x, leaf, '%s[%d]' % (path, i)) for i, x in enumerate(loss)]
        return type(loss)(items) if type(loss) in (list, tuple) else items
    if not isinstance(loss, nd.NDArray):
        raise TypeError('scale_loss takes an NDArray or (nested) lists/tuples of NDArrays; %s '
                        'is a %s. Compute the loss with MXNet operators (or wrap a number with '
                        'mx.nd.array) inside autograd.record().' % (path, type(loss).__name__))
    return leaf(loss)


def scale_losses(loss, scale):
    """``loss * scale`` (new NDArrays) for an NDArray or lists/tuples nesting them, with the
    same nesting (a namedtuple becomes a list). A float16/bfloat16 loss is multiplied in
    float32 (:func:`multiply`) and the scaled loss is float32: 2**16 is inf in float16.
    TypeError naming the position of an element that is not an NDArray."""
    return _walk(loss, lambda x: multiply(x, scale) if _low(x) else x * scale)


def _low(array):
    return dtype_name(array.dtype) in LOW_PRECISION_DTYPES


def cast_keeping_storage(array, dtype):
    """``array`` (NDArray, dense or row_sparse, any float dtype) as a new array of ``dtype``
    (mxmp name or dtype object) of the same storage: ``amp_cast`` (round to nearest even) of
    a dense array, ``astype`` of a row_sparse one (``amp_cast`` of a row_sparse array is
    dense: weight decay and momentum then reach every row). ValueError for another
    storage, or a row_sparse bfloat16 array (MXNet 1.9.1 cannot make one)."""
    target = mx_dtype(dtype_name(dtype))
    if array.stype == 'default':
        return nd.amp_cast(array, dtype=target)
    if array.stype != 'row_sparse' or 'bfloat16' in (dtype_name(dtype), dtype_name(array.dtype)):
        raise ValueError('cast_keeping_storage takes dense arrays and row_sparse float16/32/64 '
                         'arrays (MXNet has no row_sparse bfloat16), got a %s %s array'
                         % (array.stype, dtype_name(array.dtype)))
    return array.astype(target)   # sparse astype keeps the storage


def _arithmetic(array, value, divide, out):
    if not _low(array):
        if out is array:
            if divide:
                array /= value
            else:
                array *= value
            return array
        result = array / value if divide else array * value
        if out is not None:
            result.copyto(out)
            return out
        return result
    wide = cast_keeping_storage(array, 'float32')
    wide = wide / value if divide else wide * value
    if out is None:
        return wide
    if array.stype != 'default':
        cast_keeping_storage(wide, out.dtype).copyto(out)
    else:
        nd.amp_cast(wide, dtype=out.dtype, out=out)
    return out


def multiply(array, factor, out=None):
    """``array * factor`` for an NDArray (any dtype, dense or row_sparse) and a Python number,
    safe for the range of float16/bfloat16: MXNet converts the number to the array's dtype
    (2**16 is inf in float16, 2**-25 is 0), so a low-precision array is multiplied in float32.

    Args:
        array (NDArray): the operand.
        factor (float): the number.
        out (NDArray or None): where the result goes, rounded to its dtype (may be ``array``
            itself: in place). None: a new array, float32 for a low-precision ``array``.

    Returns:
        NDArray: ``out``, or the new array.
    """
    return _arithmetic(array, factor, False, out)


def divide(array, divisor, out=None):
    """``array / divisor``, as :func:`multiply` (float32 arithmetic for float16/bfloat16:
    the result is the correctly rounded quotient for a power-of-two ``divisor``)."""
    return _arithmetic(array, divisor, True, out)


def flatten_losses(loss):
    """The NDArrays of a (nested) list/tuple of losses as one flat list, in order (TypeError
    as :func:`scale_losses`)."""
    out = []
    _walk(loss, out.append)
    return out
