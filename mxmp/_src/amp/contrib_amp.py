"""``mxnet.contrib.amp``'s API on mxmp (the implementation of :mod:`mxmp.amp`): ``init``,
``init_trainer``, ``scale_loss``, ``unscale`` and the convert calls, with the names and
signatures of MXNet 1.9.1's ``mxnet/contrib/amp/amp.py``. What differs from contrib.amp and
why: docs/from_contrib_amp.md.
"""
import contextlib
import dataclasses
import logging
import warnings
from typing import Optional, Tuple

import mxnet as mx
from mxnet import autograd, gluon, optimizer

from ..dtypes import normalize_dtype
from ..gluon import attach_trainer_loss_scaler, convert, set_global
from ..gluon_graph import Conversion, policy_of
from ..graph.convert import convert_symbol as convert_graph
from ..graph.strip import arrays_for_graph, without_library_ops
from ..graph.symbol_json import load
from ..policy.policy import Policy, conditional_rules
from ..scaling import make_loss_scaler, multiply
from ..training.step import param_grads
from ..training.trainer import Trainer
from .lists import policy_for
from .loss_scaler import TrainerLossScaler

__all__ = ['init', 'disable', 'init_trainer', 'scale_loss', 'unscale', 'convert_symbol',
           'convert_model', 'convert_hybrid_block']

logger = logging.getLogger('mxmp.amp')


@dataclasses.dataclass(frozen=True)
class _Config:
    """What :func:`init` recorded: defaults of the convert calls (``policy``: the Policy
    :func:`init` was given, if any)."""
    target_dtype: Optional[str] = None
    lp_ops: Tuple[str, ...] = ()
    fp32_ops: Tuple[str, ...] = ()
    conditional_fp32_ops: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = ()
    policy: Optional[Policy] = None


_CONFIG = _Config()


def _dtype(target_dtype):
    if target_dtype is None:
        target_dtype = _CONFIG.target_dtype or 'float16'
    return normalize_dtype(target_dtype)


def _names(value, what):
    """A list of operator names as a tuple (None stays None: the default list)."""
    if value is not None and (isinstance(value, str) or
                              not all(isinstance(v, str) for v in value)):
        raise ValueError('%s must be a list of operator names, got %r' % (what, value))
    return None if value is None else tuple(value)


def _conditional(value):
    """contrib.amp's ``conditional_fp32_ops`` as the policy's rules, in the given order."""
    return None if value is None else conditional_rules(value, 'conditional_fp32_ops', tuple)


def _policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops, excluded_sym_names):
    """The mxmp Policy of a convert call: ``target_dtype`` itself when it is a Policy (the op
    lists then must be None: the policy holds them), :func:`init`'s Policy when nothing is
    given, else :func:`mxmp._src.amp.lists.policy_for` of the lists."""
    lists = (target_dtype_ops, fp32_ops, conditional_fp32_ops, excluded_sym_names)
    if isinstance(target_dtype, Policy):
        _no_lists_with(target_dtype, lists)
        return target_dtype
    if target_dtype is None and _CONFIG.policy is not None and lists == (None,) * 4:
        return _CONFIG.policy
    if excluded_sym_names is not None and not isinstance(excluded_sym_names, (list, tuple, set)):
        raise ValueError('excluded_sym_names must be a list of node names, got %r'
                         % (excluded_sym_names,))
    return policy_for(
        _dtype(target_dtype), _names(target_dtype_ops, 'target_dtype_ops'),
        _names(fp32_ops, 'fp32_ops'), _conditional(conditional_fp32_ops),
        excluded_names=set(excluded_sym_names or ()), init_lp=_CONFIG.lp_ops,
        init_fp32=_CONFIG.fp32_ops, init_conditional=_CONFIG.conditional_fp32_ops)


def _no_lists_with(policy, lists):
    if any(value is not None for value in lists):
        raise ValueError('target_dtype is an mxmp.Policy (%s), which holds the op lists: give '
                         'them as Policy(lp_ops=..., fp32_ops=..., excluded_names=...), not as '
                         'arguments as well' % policy.target_dtype)


def init(target_dtype='float16', target_precision_ops=None, conditional_fp32_ops=None,
         fp32_ops=None):
    """Switch mixed precision on for every Gluon network built or hybridized afterwards.

    Same signature as ``mxnet.contrib.amp.init``, a process-wide switch: every HybridBlock
    (not SymbolBlocks, not blocks :func:`mxmp.convert` converted) whose graph MXNet builds from
    now on runs mxmp's pass with this dtype and these lists (emulated where the context has no
    kernels, warned once); outputs are float32. A block that is not hybridized runs in float32
    (warned once). Calling ``init`` again replaces the settings, which are also the defaults
    of the ``convert_*`` calls.

    ``target_dtype``: any spelling of float16 or bfloat16, or an :class:`mxmp.Policy` (the
    lists must then be None). ``target_precision_ops`` and ``fp32_ops`` are added to mxmp's
    low-precision and float32 lists (``Policy(lp_ops=..., fp32_ops=...)``);
    ``conditional_fp32_ops``: ``(op, attribute, values)`` rules keeping matching nodes float32.

    Raises:
        ValueError: unknown dtype or malformed lists (contrib.amp asserts instead); op lists
            given with a Policy.
    """
    global _CONFIG  # pylint: disable=global-statement
    if isinstance(target_dtype, Policy):
        _no_lists_with(target_dtype, (target_precision_ops, conditional_fp32_ops, fp32_ops))
        _CONFIG = _Config(target_dtype.target_dtype, policy=target_dtype)
    else:
        _CONFIG = _Config(_dtype(target_dtype),
                          _names(target_precision_ops, 'target_precision_ops') or (),
                          _names(fp32_ops, 'fp32_ops') or (),
                          _conditional(conditional_fp32_ops) or ())
    set_global(Conversion(_policy(None, None, None, None, None)))
    logger.info('mxmp.amp: mixed precision (%s%s) on for Gluon graphs built from now on',
                _CONFIG.target_dtype, ' policy' if _CONFIG.policy is not None else '')


def disable():
    """Turn :func:`init`'s switch off: graphs built afterwards are float32 (mxmp only).

    Graphs already built keep their precision until their cache is cleared (``hybridize()``).
    The convert calls' defaults go back to contrib.amp's (float16, default lists).
    """
    global _CONFIG  # pylint: disable=global-statement
    _CONFIG = _Config()
    set_global(None)


def convert_symbol(sym, target_dtype=None, target_dtype_ops=None, fp32_ops=None,
                   conditional_fp32_ops=None, excluded_sym_names=None, data_names=None,
                   cast_optional_params=False):
    """Add cast nodes to a float32 Symbol (:func:`mxmp.convert_symbol`).

    Same signature as ``mxnet.contrib.amp.convert_symbol`` except that ``target_dtype``
    defaults to the dtype recorded by :func:`mxmp.amp.init` (else ``'float16'``).

    ``target_dtype`` may be an :class:`mxmp.Policy` (the op lists then must be None: it holds
    them). A list given (``target_dtype_ops``, ``fp32_ops``, ``conditional_fp32_ops``)
    replaces its default (``list_*``, with :func:`init`'s additions), as in contrib.amp; loss
    outputs stay float32; an op left in no list runs in its data's dtype, its parameters
    stored in that dtype; ``excluded_sym_names`` stay float32. ``data_names`` defaults, as in
    contrib.amp, to the inputs without a ``__dtype__``; ``cast_optional_params`` is
    ``cast_params=True`` (:func:`convert_model` casts the arrays). Returns the real (never
    emulated) graph, float32 outputs.

    Raises:
        AmpListConflict: an op in two lists (the default lists included), or a widest-type
            or unregistered op in a list; a ValueError and an AssertionError.
        ValueError: unknown dtype; malformed lists; an already converted graph.
    """
    policy = _policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                     excluded_sym_names)
    if data_names is None:   # contrib.amp's data inputs: the inputs without a __dtype__
        data_names = [n['name'] for n in load(sym)['nodes']
                      if n['op'] == 'null' and '__dtype__' not in n.get('attrs', {})]
    return convert_graph(sym, policy=policy, data_names=tuple(data_names),
                         cast_params=True if cast_optional_params else None)


def convert_model(sym, arg_params, aux_params, target_dtype=None, target_dtype_ops=None,
                  fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                  cast_optional_params=False):
    """Convert a float32 model (symbol and parameters) for mixed-precision inference.

    Same signature and return value as ``mxnet.contrib.amp.convert_model`` (``target_dtype``
    defaults to :func:`init`'s). The inputs that are not in ``arg_params``/``aux_params`` are
    the data inputs. Unlike contrib.amp the given dicts are not modified: new dicts are
    returned.

    Returns:
        tuple (Symbol, dict, dict): the converted graph, holding MXNet's own ops only (a model
        to deploy: plain MXNet loads it once saved), and the parameters, each cast to the
        dtype the graph gives its variable (``__dtype__``, as contrib.amp): the target dtype
        where ``cast_optional_params=True`` stores it so, float32 otherwise.

    Raises:
        TypeError: ``arg_params``/``aux_params`` are not dicts.
        ValueError: as :func:`convert_symbol`.
    """
    if not isinstance(arg_params, dict) or not isinstance(aux_params, dict):
        raise TypeError('arg_params and aux_params must be dicts of name -> NDArray')
    data_names = [n for n in sym.list_inputs() if n not in arg_params and n not in aux_params]
    out = without_library_ops(convert_symbol(
        sym, target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops, excluded_sym_names,
        data_names, cast_optional_params))
    return out, arrays_for_graph(out, arg_params), arrays_for_graph(out, aux_params)


def convert_hybrid_block(block, target_dtype=None, target_dtype_ops=None, fp32_ops=None,
                         conditional_fp32_ops=None, excluded_sym_names=None, ctx=None,
                         cast_optional_params=False):
    """Return a mixed-precision copy of a HybridBlock: its graph and a copy of its Parameters.

    Same signature as ``mxnet.contrib.amp.convert_hybrid_block`` except the defaults of
    ``target_dtype`` (:func:`init`'s, else ``'float16'``) and ``ctx`` (None: where the
    parameters are). The result is a new ``gluon.SymbolBlock`` with its own Parameters, holding
    the block's current values on ``ctx`` (as contrib.amp's), converted by :func:`mxmp.convert`
    (inputs: the block's cached graph's, else ``('data',)``; emulated where ``ctx`` has no
    kernels); ``block`` and its Parameters are left as they are, in float32.
    ``cast_optional_params=True`` stores the copy's low-precision weights in the target dtype.

    Raises:
        TypeError: not a HybridBlock, or a block that cannot be traced.
        ValueError: a Parameter without a value yet (run the block once first); as
            :func:`convert_symbol`.
    """
    if not isinstance(block, gluon.HybridBlock):
        raise TypeError('block must be a gluon.HybridBlock, got %s' % type(block).__name__)
    params = block.collect_params()
    waiting = [name for name, p in params.items() if p._data is None]
    if waiting:
        raise ValueError('%s has Parameters without a value yet (%s): initialize the block and '
                         'run it once on a batch before convert_hybrid_block, which copies the '
                         'values (as contrib.amp does), or convert the block itself with '
                         'mxmp.convert(block)' % (block.name, ', '.join(waiting[:3])))
    cached = getattr(block, '_cached_graph', None)
    if isinstance(block, gluon.SymbolBlock):
        inputs, sym = cached
    else:
        inputs = list(cached[0]) if cached else [mx.sym.var('data')]
        try:
            sym = block(*inputs)
        except Exception as err:  # any failure of hybrid_forward on Symbols
            raise TypeError('could not trace %s into a Symbol (%s: %s): its hybrid_forward '
                            'must use only F.* operators' % (block.name, type(err).__name__,
                                                             err)) from err
        if isinstance(sym, (list, tuple)):
            sym = mx.sym.Group(list(sym))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', UserWarning)   # SymbolBlock cannot type its inputs yet
        copy = gluon.SymbolBlock(sym, list(inputs))
    values = {name: p.list_data()[0] for name, p in params.items()}
    if values:
        copy.collect_params().load_dict(values, ignore_extra=True, ctx=ctx or next(
            iter(params.values())).list_ctx())
    policy = _policy(target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops,
                     excluded_sym_names)
    return convert(copy, policy=policy, cast_params=True if cast_optional_params else None)


def _is_native(optimizer_or_trainer):
    """Whether it is an mxmp.Trainer (else a gluon.Trainer); TypeError for anything else."""
    if isinstance(optimizer_or_trainer, gluon.Trainer):
        return isinstance(optimizer_or_trainer, Trainer)
    if isinstance(optimizer_or_trainer, optimizer.Optimizer):
        raise TypeError('mxmp.amp works with a gluon.Trainer (or mxmp.Trainer), not a bare '
                        'Optimizer (as contrib.amp); for the Symbolic Module use mxmp.Module')
    raise TypeError('optimizer_or_trainer must be a gluon.Trainer or mxmp.Trainer, got %s'
                    % type(optimizer_or_trainer).__name__)


def init_trainer(optimizer_or_trainer):
    """Set up loss scaling on a Trainer.

    Same signature as ``mxnet.contrib.amp.init_trainer``.

    * ``mxmp.Trainer``: nothing to do; it scales, checks and skips by itself (its
      ``loss_scaler`` argument chooses the scaling). Recommended: it also keeps float32 master
      weights, which a Trainer over bfloat16 Parameters needs (``cast_optional_params=True``).
    * ``gluon.Trainer``: a loss scaler goes in ``trainer._amp_loss_scaler``, which the Trainer
      checks before every update: a step with inf/NaN gradients on any device is skipped.
      Dynamic scaling for float16, none for bfloat16 (:func:`init`'s dtype, else the
      converted network's, else float16). ``update_on_kvstore`` left to MXNet becomes False.

    Raises:
        TypeError: not a Trainer (a bare Optimizer is refused, as in contrib.amp).
        ValueError: the Trainer updates on the kvstore, or has sparse weights (which gluon
            updates there).
    """
    trainer = optimizer_or_trainer
    if _is_native(trainer):
        return
    if trainer._contains_sparse_weight:
        raise ValueError('this gluon.Trainer has sparse (row_sparse) weights, which gluon '
                         'updates on the kvstore while the gradients are pushed, before any '
                         'overflow check could skip the step: use mxmp.Trainer, which checks '
                         'the gradients before the push (mxmp.amp.scale_loss works with it)')
    config = getattr(trainer, '_kvstore_params', {})
    if config.get('update_on_kvstore') or (trainer._kv_initialized and
                                           trainer._update_on_kvstore):
        raise ValueError('mxmp.amp cannot skip overflowing steps of a Trainer that updates on '
                         'the kvstore: create it with update_on_kvstore=False')
    if 'update_on_kvstore' in config and config['update_on_kvstore'] is None:
        config['update_on_kvstore'] = False
    dtype = _CONFIG.target_dtype
    if dtype is None:
        marks = {policy_of(p).target_dtype for p in trainer._params if policy_of(p)}
        dtype = 'bfloat16' if marks == {'bfloat16'} else 'float16'
    spec = _CONFIG.policy.loss_scaler if _CONFIG.policy is not None else None
    attach_trainer_loss_scaler(trainer, TrainerLossScaler(make_loss_scaler(spec, dtype)))


def _scaler_of(trainer):
    scaler = getattr(trainer, '_amp_loss_scaler', None)
    if not isinstance(scaler, TrainerLossScaler):
        raise RuntimeError('the loss scaler is not set up: call mxmp.amp.init_trainer(trainer) '
                           'after creating the Trainer')
    return scaler


@contextlib.contextmanager
def scale_loss(loss, optimizer_or_trainer):
    """Context manager yielding the loss times the loss scale (``autograd.backward`` it).

    Same signature and use as ``mxnet.contrib.amp.scale_loss``::

        with autograd.record():
            loss = loss_fn(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled_loss:
                autograd.backward(scaled_loss)
        trainer.step(batch_size)

    ``loss``: an NDArray or nested lists/tuples of them; a list or tuple (a namedtuple too)
    is yielded as a list, as contrib.amp does. A ``gluon.Trainer``'s ``_scale``
    is set to divide by the scale, as contrib.amp does; an ``mxmp.Trainer`` scales itself.

    Raises:
        RuntimeError: a gluon.Trainer that :func:`init_trainer` has not seen.
    """
    trainer = optimizer_or_trainer
    if _is_native(trainer):
        with trainer.scale_loss(loss) as scaled:
            yield list(scaled) if isinstance(scaled, tuple) else scaled
        return
    scaler = _scaler_of(trainer)
    trainer._scale = trainer._amp_original_scale / scaler.loss_scale
    scaled = scaler.scale_loss(loss)
    yield list(scaled) if isinstance(scaled, tuple) else scaled


def unscale(optimizer_or_trainer):
    """Divide the gradients by the loss scale in place (before clipping them).

    Same signature and meaning as ``mxnet.contrib.amp.unscale``; call between ``backward``
    and ``step``: with a ``gluon.Trainer`` every gradient (every device) is multiplied by
    ``trainer._scale`` (what :func:`scale_loss` set: the original ``rescale_grad`` over the
    loss scale) and ``trainer._scale`` becomes 1.0, so the update does not divide again and a
    second call changes nothing. inf/NaN stay, for the overflow check of the update.

    Raises:
        TypeError: not a Trainer.
        RuntimeError: a gluon.Trainer that :func:`init_trainer` has not seen; an mxmp.Trainer
            unscaled twice before its update.
    """
    trainer = optimizer_or_trainer
    if _is_native(trainer):
        trainer.unscale()
        return
    _scaler_of(trainer)
    factor = trainer._scale
    if factor != 1.0:
        with autograd.pause():
            for g in param_grads(trainer._params):
                multiply(g, factor, out=g)   # float32 arithmetic for float16/bfloat16
    trainer._scale = 1.0
