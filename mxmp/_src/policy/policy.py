"""The precision policy: which dtype each operator of a graph computes in.

A :class:`Policy` is data (a frozen dataclass): a target dtype, the op classes of
``mxmp/policy/ops_shared.py`` + ``ops_<target dtype>.py`` (:mod:`mxmp._src.policy.tables`) and the
user's overrides. The graph pass
(:mod:`mxmp._src.graph`) asks it one question per node, :meth:`Policy.classify`, and records the
answer's rule so every decision can be explained, as TensorFlow's auto_mixed_precision pass does.

Op classes (the names follow TensorFlow's allow/deny lists and ``mxnet.contrib.amp``):

``low_precision``  (allow list) runs in the target dtype: Convolution, FullyConnected, ...
``float32``        (deny list) computes in float32: softmax, norms, reductions, exp/log, ...
``loss_output``    loss heads (SoftmaxOutput, MakeLoss, ...): float32, and the Module puts its
                   loss-scale node in front of them.
``widest_type``    several float inputs that must share a dtype: all go to the widest one.
``follow``         dtype-preserving ops (relu, Pooling, reshape, BatchNorm's data, ...).

The classification rule of float16 follows NVIDIA's "Training With Mixed Precision" guide and
Micikevicius et al., "Mixed Precision Training", ICLR 2018 (matrix products in float16 with
float32 accumulation; reductions, exponentials and losses in float32).
"""
import dataclasses
import functools
import logging
from typing import FrozenSet, Optional, Tuple

from ..dtypes import TARGET_DTYPES, normalize_dtype  # noqa: F401 (normalize_dtype: old path)
from ..errors import AmpListConflict  # noqa: F401 (old import path)
from .coverage import excluded_reason
from .kernel_report import KernelReport, load_kernel_report, machine_info
from .tables import classes_for

__all__ = ['Policy', 'AmpListConflict', 'normalize_dtype', 'TARGET_DTYPES', 'LOW_PRECISION',
           'FLOAT32', 'LOSS_OUTPUT', 'WIDEST_TYPE', 'FOLLOW']

logger = logging.getLogger('mxmp.policy')

LOW_PRECISION = 'low_precision'
FLOAT32 = 'float32'
LOSS_OUTPUT = 'loss_output'
WIDEST_TYPE = 'widest_type'
FOLLOW = 'follow'

_CLASS_LISTS = ((LOW_PRECISION, 'LOW_PRECISION'), (FLOAT32, 'FLOAT32'),
                (LOSS_OUTPUT, 'LOSS_OUTPUT'), (WIDEST_TYPE, 'WIDEST_TYPE'), (FOLLOW, 'FOLLOW'))
_RULE_NAMES = {LOW_PRECISION: 'low-precision list', FLOAT32: 'float32 list',
               LOSS_OUTPUT: 'loss-output list (float32)', WIDEST_TYPE: 'widest-type list',
               FOLLOW: 'follow list'}


@functools.lru_cache(maxsize=None)
def _registered_ops():
    import mxnet as mx
    return frozenset(mx.operator.get_all_registered_operators())


@dataclasses.dataclass(frozen=True)
class Policy:
    """What dtype each operator runs in, for one target dtype.

    Args:
        target_dtype (str or dtype): ``'float16'`` or ``'bfloat16'`` (see :func:`normalize_dtype`).
        lp_ops (iterable of str): op names to run in the target dtype in addition to the
            low-precision list (moved out of whatever class they had). Default: none.
        fp32_ops (iterable of str): op names to keep in float32 (moved to the float32 class).
        excluded_names (iterable of str): node names (e.g. ``'resnetv10_dense0_fwd'``) that
            compute in float32 whatever their op.
        follow_ops (iterable of str): op names moved to the follow class: they run in the
            dtype of their inputs (widest of them), no cast of their own. Default: none.
        conditional_fp32 (iterable of (str, str, iterable of str)) or None: ``(op, attribute,
            values)`` rules, a node of ``op`` whose attribute has one of the values computes in
            float32. None (default): the rules of the dtype's table
            (``CONDITIONAL_FLOAT32``); a list replaces them.
        follow_params (bool): contrib.amp's rule for ops in no list: a follow or widest-type
            op runs in the dtype of its non-parameter float inputs, and its parameters (graph
            inputs not in ``data_names``) are stored in that dtype, instead of all inputs going
            to the widest dtype among them, parameters included. Default False; ``mxmp.amp``
            sets it.
        emulate (bool): run the low-precision graph with float32 kernels whose low-precision
            tensors are rounded through the target dtype (see :mod:`mxmp._src.graph`). Default False.
            Ops in ``EMULATE_FLOAT32`` of ``mxmp/policy/ops_<target dtype>.py`` (float16:
            Deconvolution, which MXNet 1.9.1 crashes in training when the emulation's casts
            compute its weight) then compute in float32 unless named in ``lp_ops``.

    Raises:
        ValueError: unknown target dtype; an op name MXNet 1.9.1 does not register; a
            malformed ``conditional_fp32`` entry.
        AmpListConflict: an op in two of ``lp_ops``, ``fp32_ops``, ``follow_ops`` (a
            ValueError). The message names the offending entries.
    """
    target_dtype: str = 'bfloat16'
    lp_ops: FrozenSet[str] = frozenset()
    fp32_ops: FrozenSet[str] = frozenset()
    excluded_names: FrozenSet[str] = frozenset()
    emulate: bool = False
    follow_ops: FrozenSet[str] = frozenset()
    conditional_fp32: Optional[Tuple[Tuple[str, str, FrozenSet[str]], ...]] = None
    follow_params: bool = False

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_('target_dtype', normalize_dtype(self.target_dtype))
        for field in ('lp_ops', 'fp32_ops', 'excluded_names', 'follow_ops'):
            value = getattr(self, field)
            if isinstance(value, str):
                raise ValueError('%s must be a list of names, not the string %r'
                                 % (field, value))
            set_(field, frozenset(value))
        set_('emulate', bool(self.emulate))
        set_('follow_params', bool(self.follow_params))
        known = _registered_ops()
        if self.conditional_fp32 is not None:
            set_('conditional_fp32', conditional_rules(self.conditional_fp32))
        for field in ('lp_ops', 'fp32_ops', 'follow_ops'):
            unknown = sorted(getattr(self, field) - known)
            if unknown:
                raise ValueError('%s names ops that MXNet does not register: %s (names are '
                                 'case-sensitive, e.g. "FullyConnected"; see '
                                 'mx.operator.get_all_registered_operators())'
                                 % (field, ', '.join(unknown)))
        for a, b in (('lp_ops', 'fp32_ops'), ('lp_ops', 'follow_ops'),
                     ('fp32_ops', 'follow_ops')):
            both = sorted(getattr(self, a) & getattr(self, b))
            if both:
                raise AmpListConflict('ops put in both %s and %s: %s; choose one class each'
                                      % (a, b, ', '.join(both)))

    # -- the op classes -------------------------------------------------------------------
    @property
    def classes(self):
        """dict: class name -> frozenset of op names, after the user's overrides."""
        return _effective_classes(self.target_dtype, self.lp_ops, self.fp32_ops,
                                  self.follow_ops)

    def ops_in(self, op_class):
        """frozenset of the op names in ``op_class`` (one of the class constants)."""
        return self.classes[op_class]

    def float32_inputs(self, op):
        """Input positions of ``op`` that always stay float32 (BatchNorm's gamma, beta, stats)."""
        return classes_for(self.target_dtype).get('FLOAT32_INPUTS', {}).get(op, ())

    def index_inputs(self, op):
        """Input positions of ``op`` that hold indices or lengths: never cast."""
        return classes_for(self.target_dtype).get('INDEX_INPUTS', {}).get(op, ())

    def classify(self, op, attrs=None, name=None):
        """Choose the class of one node.

        Args:
            op (str): the operator name (``'Convolution'``).
            attrs (dict of str -> str): the node's attributes, for conditional rules.
            name (str): the node's name, for ``excluded_names``.

        Returns:
            tuple ``(op_class, rule)``: one of the class constants and a human-readable reason,
            e.g. ``('float32', 'conditional float32: Activation act_type=softrelu')``.
        """
        attrs = attrs or {}
        if name is not None and name in self.excluded_names:
            return FLOAT32, 'excluded_names (user override)'
        if op in self.lp_ops:
            return LOW_PRECISION, 'lp_ops (user override)'
        if op in self.fp32_ops:
            return FLOAT32, 'fp32_ops (user override)'
        conditions = self.conditional_rules
        for attr, values in conditions.get(op, {}).items():
            if attrs.get(attr) in values:
                return FLOAT32, 'conditional float32: %s %s=%s' % (op, attr, attrs[attr])
        if self.emulate:
            reason = classes_for(self.target_dtype)['EMULATE_FLOAT32'].get(op)
            if reason:
                return FLOAT32, 'float32 under emulation: ' + reason
        if op in self.follow_ops:
            return FOLLOW, 'follow_ops (user override)'
        for op_class, ops in self.classes.items():
            if op in ops:
                return op_class, _RULE_NAMES[op_class]
        reason = excluded_reason(op)
        _warn_unlisted(op, reason)
        return FLOAT32, 'in no list: float32' + (' (%s)' % reason if reason else '')

    @property
    def conditional_rules(self):
        """dict: op -> {attribute: frozenset of values that make the op compute in float32}."""
        if self.conditional_fp32 is None:
            return classes_for(self.target_dtype).get('CONDITIONAL_FLOAT32', {})
        rules = {}
        for op, attr, values in self.conditional_fp32:
            rules.setdefault(op, {})[attr] = values
        return rules

    @classmethod
    def from_kernel_report(cls, report, allow_other_cpu=False, **kwargs):
        """A policy whose classes follow the evidence of ``mxmp check-kernels`` on a machine.

        Ops with any case ``wrong``, ``crash`` or ``error`` in the report go to ``fp32_ops``;
        ops the lists keep in float32 that the report shows ``ok`` in every case on real
        kernels go to ``lp_ops`` (see :mod:`mxmp._src.policy.kernel_report`). Aliases follow their op.

        Args:
            report (str or mxmp.KernelReport): a report file written by
                ``mxmp check-kernels --out FILE`` or :meth:`KernelReport.save`, or the object.
            allow_other_cpu (bool): accept a report measured on another CPU model than this
                one (default False: evidence about one CPU's kernels says nothing of another's).
            **kwargs: the other :class:`Policy` fields (``lp_ops``, ``fp32_ops``,
                ``excluded_names``, ``emulate``); the user's ``lp_ops``/``fp32_ops`` win over the
                report's.

        Returns:
            Policy: with the report's target dtype.

        Raises:
            ValueError: a malformed file (the message names the problem); a report from another
                CPU model without ``allow_other_cpu=True``; ``target_dtype`` in ``kwargs`` that
                differs from the report's.
        """
        if not isinstance(report, KernelReport):
            source = str(report)
            report = load_kernel_report(report)
        else:
            source = 'the report'
        target = kwargs.pop('target_dtype', report.target_dtype)
        if normalize_dtype(target) != report.target_dtype:
            raise ValueError('%s is a %s report; it cannot set a %s policy'
                             % (source, report.target_dtype, target))
        here = machine_info(report.target_dtype)['cpu']
        if report.machine.get('cpu') != here and not allow_other_cpu:
            raise ValueError('%s was measured on %r, this machine is %r: kernels differ between '
                             'CPUs; run `mxmp check-kernels` here, or pass allow_other_cpu=True '
                             'to use it anyway' % (source, report.machine.get('cpu'), here))
        user_lp = frozenset(kwargs.pop('lp_ops', ()))
        user_fp32 = frozenset(kwargs.pop('fp32_ops', ()))
        classes = cls(report.target_dtype).classes
        lp, fp32 = report.policy_changes(classes[FLOAT32] | classes[LOSS_OUTPUT])
        known = _registered_ops()
        lp = (lp & known) - user_fp32 | user_lp
        fp32 = (fp32 & known) - user_lp | user_fp32
        return cls(report.target_dtype, lp_ops=lp - fp32, fp32_ops=fp32, **kwargs)

    def replace(self, **changes):
        """A copy of this policy with some fields changed (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


def conditional_rules(entries, what='conditional_fp32', collect=frozenset):
    """Validate conditional float32 rules, as ``Policy(conditional_fp32=...)`` takes them.

    Args:
        entries (iterable of (str, str, str or iterable of str)): ``(op, attribute, values)``;
            a single string value stands for a one-value list.
        what (str): the argument's name, for the error message (default
            ``'conditional_fp32'``; ``mxmp.amp.init`` says ``'conditional_fp32_ops'``).
        collect (callable): what the values become (default frozenset; ``tuple`` keeps order).

    Returns:
        tuple of ``(op, attribute, collect(values))``, all names as str.

    Raises:
        ValueError: an entry that is not a 3-item ``(op, attribute, values)``; the message
            shows the expected form.
    """
    out = []
    for entry in entries:
        try:
            op, attr, values = entry
        except (TypeError, ValueError):
            raise ValueError('%s entries are (op name, attribute name, list of values), e.g. '
                             '("Activation", "act_type", ["softrelu"]); got %r'
                             % (what, entry)) from None
        if isinstance(values, str):
            values = (values,)
        out.append((str(op), str(attr), collect(str(v) for v in values)))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _effective_classes(target_dtype, lp_ops, fp32_ops, follow_ops=frozenset()):
    module = classes_for(target_dtype)
    moved = lp_ops | fp32_ops | follow_ops
    out = {}
    for op_class, list_name in _CLASS_LISTS:
        out[op_class] = frozenset(module.get(list_name, ())) - moved
    out[LOW_PRECISION] |= lp_ops
    out[FLOAT32] |= fp32_ops
    out[FOLLOW] |= follow_ops
    return out


@functools.lru_cache(maxsize=None)
def _warn_unlisted(op, reason):
    logger.warning('operator %s is in no mxmp op list%s: it computes in float32. Add it to '
                   'Policy(lp_ops=...) or Policy(fp32_ops=...) to silence this.',
                   op, ' (%s)' % reason if reason else '')
