"""The precision policy: one frozen dataclass holding every precision setting of a conversion.

Op classes (names after TensorFlow's allow/deny lists and ``mxnet.contrib.amp``):
``low_precision`` runs in the target dtype; ``float32`` computes in float32; ``loss_output``
(loss heads) computes in float32 and gets the Module's loss-scale node; ``widest_type`` casts
its float inputs to the widest of their dtypes; ``follow`` runs in its inputs' dtype. The float16
rule follows NVIDIA's "Training With Mixed Precision" guide and Micikevicius et al., "Mixed
Precision Training", ICLR 2018.
"""
import dataclasses
import functools
import logging
from typing import Any, FrozenSet, Optional, Tuple, Union

from ..dtypes import normalize_dtype
from ..errors import AmpListConflict
from .tables import OP_CLASSES, classes_for, excluded_reason, rules_by_op

__all__ = ['Policy', 'resolve_policy', 'conditional_rules', 'LOW_PRECISION', 'FLOAT32',
           'LOSS_OUTPUT', 'WIDEST_TYPE', 'FOLLOW']

logger = logging.getLogger('mxmp.policy')

LOW_PRECISION = 'low_precision'
FLOAT32 = 'float32'
LOSS_OUTPUT = 'loss_output'
WIDEST_TYPE = 'widest_type'
FOLLOW = 'follow'

_RULE_NAMES = {LOW_PRECISION: 'low-precision list', FLOAT32: 'float32 list',
               LOSS_OUTPUT: 'loss-output list (float32)', WIDEST_TYPE: 'widest-type list',
               FOLLOW: 'follow list'}
_LOSS_SCALERS = ('auto', 'dynamic', 'static', 'none')
_EMULATION_SAID = set()   # (dtype, context) pairs already warned about
_KERNELS_SAID = set()     # contexts told that kernels='all' has no kernels there


@functools.lru_cache(maxsize=None)
def _registered_ops():
    import mxnet as mx
    return frozenset(mx.operator.get_all_registered_operators())


@dataclasses.dataclass(frozen=True)
class Policy:
    """Every precision setting of a conversion, as data.

    Args:
        target_dtype (str or dtype): ``'bfloat16'`` (default) or ``'float16'``
            (:func:`mxmp.normalize_dtype` spellings).
        lp_ops (iterable of str): ops run in the target dtype, moved out of their class.
        fp32_ops (iterable of str): ops moved to the float32 class.
        excluded_names (iterable of str): node names that compute in float32 whatever their op.
        emulate ('auto', True or False): run low-precision numerics with float32 kernels whose
            low-precision tensors are rounded through the target dtype. ``'auto'`` (default):
            where an entry point runs on a context without kernels for the target dtype
            (:func:`mxmp.lp_kernels_available`), said once in a warning; entry points without a
            context (:func:`mxmp.convert_symbol`, :func:`mxmp.explain`) take it as False. Ops
            in ``EMULATE_FLOAT32`` of ``ops_<target dtype>.py`` compute in float32 when emulated,
            unless named in ``lp_ops``.
        follow_ops (iterable of str): ops moved to the follow class.
        conditional_fp32 (iterable of (op, attribute, values)) or None: a node of ``op`` whose
            attribute has one of the values computes in float32. None (default): the table's
            ``CONDITIONAL_FLOAT32``; a list replaces them.
        follow_params (bool): contrib.amp's rule: a follow or widest-type op runs in the dtype
            of its non-parameter float inputs and its parameters are stored in that dtype.
            Default False; :mod:`mxmp.amp` sets it.
        param_dtype (str): ``'float32'`` (default), or the target dtype: the weights whose every
            consumer takes them in the target dtype are stored in it (``cast_params=True``).
        cast_moved_params (bool): with ``param_dtype`` the target dtype, also store in it the
            weights that reach low-precision ops only through Reshape/Concat/stack/expand_dims
            of weights alone (GluonNLP's BERT concatenates its query/key/value weights before
            one FullyConnected): no float32 concatenation and cast of them per call (BERT-base
            training: 50 MiB less allocated, docs/benchmark.md). Default True; False keeps them
            float32, cast after the concatenation.
        output_dtype (str): dtype of the graph outputs; only ``'float32'``.
        loss_scaler: ``'auto'`` (default: ``'dynamic'`` for float16, ``'none'`` for bfloat16),
            ``'dynamic'``, ``'static'``, ``'none'`` (None is read as ``'none'``), or a
            :class:`mxmp.LossScaler` value; stored for the Trainers, which build the scaler
            (:func:`mxmp.make_loss_scaler`).
        kernels (str): ``'auto'`` (default): for bfloat16, ops whose MXNet 1.9.1 CPU kernel is
            slow (LayerNorm, Dropout, softmax with lengths, GELU) run mxmp's own kernel, built on
            first use where a C++ compiler is found, MXNet's elsewhere (the pass's kernel rule,
            docs/pass.md; the library Dropout draws other masks than MXNet's, with the same
            accuracy: docs/accuracy.md); ``'all'``: every library kernel, also
            ``batch_dot`` as ``mxmp_batch_dot`` (bfloat16 products on the ``avx512_bf16`` tier:
            opt-in, as GluonNLP's attention cell surrounds it with float32 ``transpose`` and its
            casts);
            ``'mxnet'``: MXNet's kernels only.
        reductions (str): ``'auto'`` (default): for bfloat16, float32 ``sum``/``mean`` over
            the last axis, or over all axes but the first, run as a FullyConnected product
            with ones (MXNet 1.9.1's CPU reduction is 25-40x slower; the pass's reduction
            rule, :mod:`mxmp._src.graph.reduce_rule`); ``'mxnet'``: MXNet's reduction.
        residual_dtype (str): dtype of the tensor between a float32 LayerNorm and its consumers
            (in a post-LayerNorm transformer such as BERT, the residual stream).
            ``'float32'``: the LayerNorm's output stays float32 and each low-precision
            consumer casts it. ``'target'`` (default): it is cast to the target dtype once,
            right after the LayerNorm, and every consumer that does not compute in float32
            reads that (residual adds included: with mxmp's library Dropout on the branch,
            BERT's adds then run in bfloat16 and the next library LayerNorm takes bfloat16);
            graph outputs stay float32 (the pass's residual rule,
            :mod:`mxmp._src.graph.residual_rule`). The default since the post-LayerNorm KJV
            study of docs/accuracy.md ("The residual stream in bfloat16") stayed within 0.1%
            of float32's perplexity (paired seeds, 95% interval inside +-0.1%).

    Raises:
        ValueError: unknown target dtype; an op name MXNet 1.9.1 does not register; a malformed
            ``conditional_fp32`` entry; a bad ``emulate``, ``param_dtype``, ``output_dtype``,
            ``loss_scaler``, ``kernels``, ``reductions`` or ``residual_dtype``.
        AmpListConflict: an op in two of ``lp_ops``, ``fp32_ops``, ``follow_ops``.
    """
    target_dtype: str = 'bfloat16'
    lp_ops: FrozenSet[str] = frozenset()
    fp32_ops: FrozenSet[str] = frozenset()
    excluded_names: FrozenSet[str] = frozenset()
    emulate: Union[str, bool] = 'auto'
    follow_ops: FrozenSet[str] = frozenset()
    conditional_fp32: Optional[Tuple[Tuple[str, str, FrozenSet[str]], ...]] = None
    follow_params: bool = False
    param_dtype: str = 'float32'
    cast_moved_params: bool = True
    output_dtype: str = 'float32'
    loss_scaler: Any = 'auto'
    kernels: str = 'auto'
    reductions: str = 'auto'
    residual_dtype: str = 'target'

    def __post_init__(self):
        set_ = functools.partial(object.__setattr__, self)
        set_('target_dtype', normalize_dtype(self.target_dtype))
        for field in ('lp_ops', 'fp32_ops', 'excluded_names', 'follow_ops'):
            value = getattr(self, field)
            if isinstance(value, str):
                raise ValueError('%s must be a list of names, not the string %r'
                                 % (field, value))
            unknown = [] if field == 'excluded_names' else sorted(set(value) - _registered_ops())
            if unknown:
                raise ValueError('%s names ops that MXNet does not register: %s (names are '
                                 'case-sensitive, e.g. "FullyConnected"; see '
                                 'mx.operator.get_all_registered_operators())'
                                 % (field, ', '.join(unknown)))
            set_(field, frozenset(value))
        if self.emulate not in ('auto', True, False):
            raise ValueError("emulate=%r: use 'auto', True or False" % (self.emulate,))
        if self.emulate != 'auto':
            set_('emulate', bool(self.emulate))
        set_('follow_params', bool(self.follow_params))
        set_('cast_moved_params', bool(self.cast_moved_params))
        param = normalize_dtype(self.param_dtype, allow_float32=True)
        if param not in ('float32', self.target_dtype):
            raise ValueError('param_dtype=%r: use float32 or the target dtype %s'
                             % (self.param_dtype, self.target_dtype))
        set_('param_dtype', param)
        if normalize_dtype(self.output_dtype, allow_float32=True) != 'float32':
            raise ValueError('output_dtype=%r: converted graphs have float32 outputs'
                             % (self.output_dtype,))
        set_('output_dtype', 'float32')
        if self.loss_scaler is None:
            set_('loss_scaler', 'none')
        if self.loss_scaler not in _LOSS_SCALERS and not hasattr(self.loss_scaler, 'scale'):
            raise ValueError("loss_scaler=%r: use 'auto', 'dynamic', 'static', 'none' or an "
                             "mxmp.LossScaler" % (self.loss_scaler,))
        if self.kernels not in ('auto', 'all', 'mxnet'):
            raise ValueError("kernels=%r: use 'auto' (mxmp's kernels where they build), 'all' "
                             "(every library kernel) or 'mxnet'" % (self.kernels,))
        if self.reductions not in ('auto', 'mxnet'):
            raise ValueError("reductions=%r: use 'auto' (sum/mean as a product with ones) or "
                             "'mxnet'" % (self.reductions,))
        if self.residual_dtype not in ('float32', 'target'):
            raise ValueError("residual_dtype=%r: use 'float32' (LayerNorm outputs stay float32) "
                             "or 'target' (cast to the target dtype after the LayerNorm)"
                             % (self.residual_dtype,))
        if self.conditional_fp32 is not None:
            set_('conditional_fp32', conditional_rules(self.conditional_fp32))
        for a, b in (('lp_ops', 'fp32_ops'), ('lp_ops', 'follow_ops'),
                     ('fp32_ops', 'follow_ops')):
            both = sorted(getattr(self, a) & getattr(self, b))
            if both:
                raise AmpListConflict('ops put in both %s and %s: %s; choose one class each'
                                      % (a, b, ', '.join(both)))

    @property
    def cast_params(self):
        """bool: whether weights are stored in the target dtype (``param_dtype``)."""
        return self.param_dtype != 'float32'

    @property
    def classes(self):
        """dict: class name -> frozenset of op names, after the overrides."""
        return _effective_classes(self.target_dtype, self.lp_ops, self.fp32_ops,
                                  self.follow_ops)

    def ops_in(self, op_class):
        """frozenset of the op names in ``op_class`` (one of the class constants)."""
        return self.classes[op_class]

    def float32_inputs(self, op):
        """Input positions of ``op`` that always stay float32 (BatchNorm's gamma, beta, stats)."""
        return classes_for(self.target_dtype)['FLOAT32_INPUTS'].get(op, ())

    def index_inputs(self, op):
        """Input positions of ``op`` that hold indices or lengths: never cast."""
        return classes_for(self.target_dtype)['INDEX_INPUTS'].get(op, ())

    def classify(self, op, attrs=None, name=None):
        """``(op_class, rule)`` of one node: a class constant and the human-readable reason.

        Args:
            op (str): the operator name. attrs (dict of str -> str): the node's attributes.
            name (str): the node's name, for ``excluded_names``.
        """
        attrs = attrs or {}
        if name is not None and name in self.excluded_names:
            return FLOAT32, 'excluded_names (user override)'
        if op in self.lp_ops:
            return LOW_PRECISION, 'lp_ops (user override)'
        if op in self.fp32_ops:
            return FLOAT32, 'fp32_ops (user override)'
        rules = (classes_for(self.target_dtype)['CONDITIONAL_FLOAT32']
                 if self.conditional_fp32 is None else rules_by_op(self.conditional_fp32))
        for attr, values in rules.get(op, {}).items():
            if attrs.get(attr) in values:
                return FLOAT32, 'conditional float32: %s %s=%s' % (op, attr, attrs[attr])
        if self.emulate is True:
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

    @classmethod
    def from_kernel_report(cls, report, allow_other_cpu=False, **kwargs):
        """A policy whose classes follow the evidence of ``mxmp check-kernels`` on this CPU.

        Ops with any case ``wrong``, ``crash`` or ``error`` go to ``fp32_ops``; float32 ops
        ``ok`` in every case on real kernels go to ``lp_ops``; aliases follow their op.

        Args:
            report (str or mxmp.KernelReport): a report file (``mxmp check-kernels --out``) or
                the object.
            allow_other_cpu (bool): accept a report measured on another CPU model.
            **kwargs: the other :class:`Policy` fields; the user's ``lp_ops``/``fp32_ops`` win.

        Raises:
            ValueError: a malformed file; a report from another CPU model without
                ``allow_other_cpu=True``; a ``target_dtype`` other than the report's.
        """
        from .kernel_report import KernelReport, load_kernel_report, machine_info
        source = 'the report' if isinstance(report, KernelReport) else str(report)
        if not isinstance(report, KernelReport):
            report = load_kernel_report(report)
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

    def on(self, ctx):
        """This policy for a graph that runs on ``ctx`` (mx.Context), ``emulate`` a bool: the
        one place ``'auto'`` is resolved (emulate where ``ctx`` has no kernels for the target
        dtype, :func:`mxmp.lp_kernels_available`; said once per dtype and context). On a
        context other than the CPU, ``kernels`` is ``'mxnet'``: mxmp's operator library has CPU
        kernels only (``kernels='all'`` there is said once in a warning).

        Raises:
            RuntimeError: ``emulate`` is False and ``ctx`` has no kernels for the target dtype
                (checked up front: MXNet would fail asynchronously, far from the cause).
        """
        from ..device import lp_kernels_available, tensor_core_note
        if ctx.device_type != 'cpu' and self.kernels != 'mxnet':
            # mxmp's operator library has CPU kernels only: the kernel rule stays off
            if self.kernels == 'all' and str(ctx) not in _KERNELS_SAID:
                _KERNELS_SAID.add(str(ctx))
                logger.warning("mxmp: Policy(kernels='all') on %s: mxmp's operator library "
                               "has CPU kernels only; MXNet's kernels run there", ctx)
            return self.replace(kernels='mxnet').on(ctx)
        dtype, emulate = self.target_dtype, self.emulate
        if emulate is True:
            return self
        if lp_kernels_available(dtype, ctx):   # GpuProbeError: the GPU failed, not its kernels
            if ctx.device_type == 'gpu' and dtype == 'float16':
                tensor_core_note(ctx.device_id)
            return self if emulate is False else self.replace(emulate=False)
        if emulate is False:
            why = ('its Convolution/FullyConnected refuse %s in this MXNet build' % dtype
                   if ctx.device_type == 'gpu' else
                   'MXNet 1.9.1 has no float16 GEMM on CPUs; float16 kernels run on NVIDIA '
                   'GPUs' if dtype == 'float16' else
                   'oneDNN runs bfloat16 Convolution/FullyConnected on CPUs with AVX-512 only')
            raise RuntimeError(
                '%s has no %s kernels (%s). Pass emulate=True (or the default '
                'emulate=\'auto\') to run the same numerics with float32 kernels.'
                % (ctx, dtype, why))
        if (dtype, str(ctx)) not in _EMULATION_SAID:
            _EMULATION_SAID.add((dtype, str(ctx)))
            logger.warning('mxmp: %s has no %s kernels; mxmp emulates %s numerics with float32 '
                           'kernels (same results, float32 speed)', ctx, dtype, dtype)
        return self.replace(emulate=True)


def resolve_policy(policy=None, target_dtype=None, cast_params=None, emulate=None):
    """The policy of an entry point from its ``policy`` and keyword shorthands.

    A shorthand given (not None) sets its field where ``policy`` leaves the default
    (``cast_params=True``: ``param_dtype`` = target dtype); one that differs from a field the
    policy sets raises.

    Raises:
        TypeError: ``policy`` is not a Policy.
        ValueError: a shorthand contradicts ``policy``; unknown dtype; bad ``emulate``.
    """
    if policy is None:
        policy = Policy(target_dtype or 'bfloat16')
    elif not isinstance(policy, Policy):
        raise TypeError('policy must be an mxmp.Policy, got %s' % type(policy).__name__)
    elif target_dtype is not None and \
            normalize_dtype(target_dtype, allow_float32=True) != policy.target_dtype:
        raise ValueError('target_dtype=%r contradicts policy.target_dtype=%r: give one of them'
                         % (target_dtype, policy.target_dtype))
    changes = {}
    if cast_params is not None:
        param = policy.target_dtype if cast_params else 'float32'
        if param != policy.param_dtype and policy.param_dtype != 'float32':
            raise ValueError('cast_params=%r contradicts policy.param_dtype=%r'
                             % (cast_params, policy.param_dtype))
        changes['param_dtype'] = param
    if emulate is not None and emulate != policy.emulate:
        if policy.emulate != 'auto':
            raise ValueError('emulate=%r contradicts policy.emulate=%r'
                             % (emulate, policy.emulate))
        changes['emulate'] = emulate
    return policy.replace(**changes) if changes else policy


def conditional_rules(entries, what='conditional_fp32', collect=frozenset):
    """Validated ``(op, attribute, values)`` rules: a tuple of ``(str, str, collect(values))``.

    A single string value stands for a one-value list; ``what`` names the argument in the
    error; ``collect`` (default frozenset; ``tuple`` keeps order) makes the values.

    Raises:
        ValueError: an entry that is not a 3-item ``(op, attribute, values)``.
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
    table, moved = classes_for(target_dtype), lp_ops | fp32_ops | follow_ops
    # the class constants are the table's names in lower case
    out = {name.lower(): table[name] - moved for name in OP_CLASSES}
    out[LOW_PRECISION] |= lp_ops
    out[FLOAT32] |= fp32_ops
    out[FOLLOW] |= follow_ops
    return out


@functools.lru_cache(maxsize=None)
def _warn_unlisted(op, reason):
    logger.warning('operator %s is in no mxmp op list%s: it computes in float32. Add it to '
                   'Policy(lp_ops=...) or Policy(fp32_ops=...) to silence this.',
                   op, ' (%s)' % reason if reason else '')
