"""The op table of each target dtype (``ops_shared.py`` plus ``ops_<dtype>.py``), and the
rules that leave registered operators out of it.

The modules hold each class as ``{group: (op, ...)}`` (:func:`ops_of` flattens one) and list no
alias. Every name of ``mx.operator.get_all_registered_operators()`` is in exactly one class of each
table or matched by :data:`EXCLUDED_PREFIXES`. An alias (a name MXNet registers for another op's
handle) is classified with its canonical op, from MXNet's registry (a Symbol's JSON names the
canonical op), so the modules list none; an op in no class (a custom op) computes in float32.
"""
import functools

from . import ops_bfloat16, ops_float16, ops_shared

__all__ = ['OP_CLASSES', 'table', 'classes_for', 'aliases', 'registered_aliases',
           'ops_of', 'EXCLUDED_PREFIXES', 'excluded_reason', 'rules_by_op']

#: Names of the classes of a table ({group: (op, ...)} in the modules, sorted tuples merged).
OP_CLASSES = ('LOW_PRECISION', 'FLOAT32', 'LOSS_OUTPUT', 'WIDEST_TYPE', 'FOLLOW')
#: Names of the {op: ...} dicts of a table.
_DICTS = ('FLOAT32_INPUTS', 'INDEX_INPUTS', 'EMULATE_FLOAT32')

_DIFFERENCES = {'float16': ops_float16, 'bfloat16': ops_bfloat16}


@functools.lru_cache(maxsize=None)
def table(target_dtype):
    """The merged table of ``'float16'`` or ``'bfloat16'`` (cached: do not modify it): the names
    of :data:`OP_CLASSES` -> sorted tuples of op names, ``'CONDITIONAL_FLOAT32'`` -> tuple of
    ``(op, attribute, values)``, and the ``{op: ...}`` dicts as :func:`classes_for`. Each alias
    of a listed op (:func:`registered_aliases`) that no :data:`EXCLUDED_PREFIXES` rule excludes
    is in its op's class, rules and dicts.

    Raises:
        ValueError: another dtype name; an op listed both in ops_shared.py and the dtype's module
            (or twice in one).
    """
    if target_dtype not in _DIFFERENCES:
        raise ValueError('target dtype must be "float16" or "bfloat16", got %r' % (target_dtype,))
    diff = _DIFFERENCES[target_dtype]
    listed = {}
    for module in (ops_shared, diff):
        for name in OP_CLASSES:
            for op in ops_of(getattr(module, name, {})):
                if op in listed:
                    raise ValueError('%s is listed twice for %s (%s and %s): an op whose class is '
                                     'the same for every target dtype belongs in ops_shared.py '
                                     'only, else in each ops_<dtype>.py only'
                                     % (op, target_dtype, listed[op], module.__name__))
                listed[op] = module.__name__
    follow = _classified_aliases()
    out = {}
    for name in OP_CLASSES:
        ops = set(ops_of(getattr(ops_shared, name, {})) + ops_of(getattr(diff, name, {})))
        out[name] = tuple(sorted(ops | {alias for alias, op in follow.items() if op in ops}))
    rules = (tuple(getattr(ops_shared, 'CONDITIONAL_FLOAT32', ()))
             + tuple(getattr(diff, 'CONDITIONAL_FLOAT32', ())))
    out['CONDITIONAL_FLOAT32'] = rules + tuple(
        (alias, attr, values) for alias, op in sorted(follow.items())
        for rule_op, attr, values in rules if rule_op == op)
    for name in _DICTS:
        merged = dict(getattr(ops_shared, name, {}), **getattr(diff, name, {}))
        merged.update((alias, merged[op]) for alias, op in follow.items() if op in merged)
        out[name] = dict(sorted(merged.items()))
    return out


def ops_of(groups):
    """The op names of one class of an ops_*.py module, ``{group: (op, ...)}``, as one tuple."""
    return tuple(op for ops in groups.values() for op in ops)


def classes_for(target_dtype):
    """The operator classes of ``'float16'`` or ``'bfloat16'`` (a new dict on every call).

    Returns:
        dict: the class names of :data:`OP_CLASSES` -> frozenset of op names;
        ``'CONDITIONAL_FLOAT32'``: ``{op: {attr: frozenset(values)}}``; ``'FLOAT32_INPUTS'``,
        ``'INDEX_INPUTS'``: ``{op: tuple of input positions}``; ``'EMULATE_FLOAT32'``:
        ``{op: reason}`` (ops computing in float32 when emulated).

    Raises:
        ValueError: another dtype name.
    """
    merged = table(target_dtype)
    classes = {name: frozenset(merged[name]) for name in OP_CLASSES}
    classes['CONDITIONAL_FLOAT32'] = rules_by_op(merged['CONDITIONAL_FLOAT32'])
    classes.update((name, dict(merged[name])) for name in _DICTS)
    return classes


def rules_by_op(entries):
    """``(op, attribute, values)`` rules as ``{op: {attribute: frozenset(values)}}``."""
    rules = {}
    for op, attr, values in entries:
        rules.setdefault(op, {})[attr] = frozenset(values)
    return rules


def aliases(target_dtype):
    """``{alias: canonical op}`` of the aliases one target dtype's table classifies (each with
    its canonical op), from MXNet's registry; a new dict on every call.

    Raises:
        ValueError: another dtype name.
    """
    merged = table(target_dtype)
    classified = set().union(*(merged[name] for name in OP_CLASSES))
    return {alias: op for alias, op in _classified_aliases().items() if alias in classified}


@functools.lru_cache
def registered_aliases():
    """``{alias: canonical op}`` of every operator name MXNet registers for another op: an
    alias shares its op's handle, whose info names the canonical op (cached: do not modify)."""
    import ctypes

    import mxnet as mx
    from mxnet.base import _LIB, OpHandle, c_str, check_call, py_str
    out = {}
    for name in mx.operator.get_all_registered_operators():
        handle = OpHandle()
        check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
        canonical, desc, key_var_num_args, return_type = (ctypes.c_char_p() for _ in range(4))
        num_args = ctypes.c_uint()
        arg_names, arg_types, arg_descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
        check_call(_LIB.MXSymbolGetAtomicSymbolInfo(
            handle, ctypes.byref(canonical), ctypes.byref(desc), ctypes.byref(num_args),
            ctypes.byref(arg_names), ctypes.byref(arg_types), ctypes.byref(arg_descs),
            ctypes.byref(key_var_num_args), ctypes.byref(return_type)))
        if py_str(canonical.value) != name:
            out[name] = py_str(canonical.value)
    return out


@functools.lru_cache
def _classified_aliases():
    """:func:`registered_aliases` without the names an :data:`EXCLUDED_PREFIXES` rule excludes
    (cached: do not modify)."""
    return {alias: op for alias, op in registered_aliases().items()
            if excluded_reason(alias) is None}


#: (prefix, reason): registered names starting with the prefix are not classified.
EXCLUDED_PREFIXES = (
    ('_backward_', 'gradient op: created by autograd or the executor from a forward op, never '
                   'part of a forward Symbol; it runs in the dtype its forward op chose'),
    ('_contrib_backward_', 'gradient op of a contrib op (as _backward_)'),
    ('_np_', 'numpy-interface op (mx.np): mxmp converts legacy mx.sym / Gluon graphs, not '
             'numpy-mode (npx.set_np) graphs, like contrib.amp in MXNet 1.9.1'),
    ('_npi_', 'numpy-interface internal op (mx.np): not converted, as _np_'),
    ('_npx_', 'numpy-extension op (mx.npx): not converted, as _np_; the legacy operators among '
              'them (_npx_activation for Activation, ...) are aliases whose canonical name is '
              'classified'),
    ('mxmp_', "op of mxmp's operator library (mxmp/_src/kernels), registered when it loads: "
              "only the pass's kernel rule places it, in float32"),
    ('amp_', 'mixed-precision cast op (amp_cast, amp_multicast): inserted and managed by the '
             'graph pass itself'),
)


def excluded_reason(op_name):
    """The reason (str) of the first :data:`EXCLUDED_PREFIXES` rule matching ``op_name``, or
    None when the op is classified."""
    if op_name == '_np_cumsum':   # legacy cumsum's canonical name: legacy graphs hold it
        return None
    for prefix, reason in EXCLUDED_PREFIXES:
        if op_name.startswith(prefix):
            return reason
    return None
