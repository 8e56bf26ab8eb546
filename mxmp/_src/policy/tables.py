"""The op table of each target dtype: :mod:`~mxmp._src.policy.ops_shared` plus the dtype's differences.

``ops_shared.py`` holds the ops whose class is the same for float16 and bfloat16;
``ops_float16.py`` and ``ops_bfloat16.py`` hold only the ops whose class differs, and the rules
of one dtype. :func:`table` merges them into the names the old per-dtype modules had
(``mxmp._src.lists.float16`` and ``mxmp._src.lists.bfloat16`` re-export it), :func:`classes_for` into the
sets :class:`~mxmp._src.policy.policy.Policy` reads.
"""
import functools

from . import ops_bfloat16, ops_float16, ops_shared

__all__ = ['OP_CLASSES', 'table', 'classes_for', 'aliases']

#: Names of the class tuples of a table.
OP_CLASSES = ('LOW_PRECISION', 'FLOAT32', 'LOSS_OUTPUT', 'WIDEST_TYPE', 'FOLLOW')
#: Names of the {op: ...} dicts of a table.
_DICTS = ('FLOAT32_INPUTS', 'INDEX_INPUTS', 'EMULATE_FLOAT32')

_DIFFERENCES = {'float16': ops_float16, 'bfloat16': ops_bfloat16}


@functools.lru_cache(maxsize=None)
def _merge(target_dtype):
    diff = _DIFFERENCES[target_dtype]
    listed = {}
    for module in (ops_shared, diff):
        for name in OP_CLASSES:
            for op in getattr(module, name, ()):
                if op in listed:
                    raise ValueError('%s is listed twice for %s (%s and %s): an op whose class is '
                                     'the same for every target dtype belongs in ops_shared.py '
                                     'only, else in each ops_<dtype>.py only'
                                     % (op, target_dtype, listed[op], module.__name__))
                listed[op] = module.__name__
    out = {name: tuple(sorted(getattr(ops_shared, name, ()) + getattr(diff, name, ())))
           for name in OP_CLASSES}
    out['CONDITIONAL_FLOAT32'] = (tuple(getattr(ops_shared, 'CONDITIONAL_FLOAT32', ()))
                                  + tuple(getattr(diff, 'CONDITIONAL_FLOAT32', ())))
    for name in _DICTS:
        if hasattr(ops_shared, name) or hasattr(diff, name):
            merged = dict(getattr(ops_shared, name, {}))
            merged.update(getattr(diff, name, {}))
            out[name] = merged
    return out


def _merged(target_dtype):
    if not isinstance(target_dtype, str) or target_dtype not in _DIFFERENCES:
        raise ValueError('target dtype must be "float16" or "bfloat16", got %r' % (target_dtype,))
    return _merge(target_dtype)


def table(target_dtype):
    """The op table of one target dtype, as the names of a per-dtype list module.

    Args:
        target_dtype (str): ``'float16'`` or ``'bfloat16'``.

    Returns:
        dict: ``'LOW_PRECISION'``, ``'FLOAT32'``, ``'LOSS_OUTPUT'``, ``'WIDEST_TYPE'``,
        ``'FOLLOW'``: sorted tuples of op names; ``'CONDITIONAL_FLOAT32'``: tuple of ``(op,
        attribute, tuple of values)``; ``'FLOAT32_INPUTS'`` and ``'INDEX_INPUTS'``: ``{op: tuple
        of input positions}``; ``'EMULATE_FLOAT32'`` (float16 only): ``{op: reason}``. A new
        dict on every call (the tuples are shared).

    Raises:
        ValueError: another dtype name; an op listed both in ops_shared.py and in the dtype's
            module.
    """
    return {name: (dict(value) if isinstance(value, dict) else value)
            for name, value in _merged(target_dtype).items()}


def classes_for(target_dtype):
    """The operator classes for one target dtype.

    Parameters
    ----------
    target_dtype : str
        ``'float16'`` or ``'bfloat16'`` (normalize other spellings with
        ``mxmp._src.dtypes.normalize_dtype`` first).

    Returns
    -------
    dict
        ``'LOW_PRECISION'``, ``'FLOAT32'``, ``'LOSS_OUTPUT'``, ``'WIDEST_TYPE'``, ``'FOLLOW'``:
        frozenset of op names. ``'CONDITIONAL_FLOAT32'``: ``{op: {attr: frozenset(values)}}``
        (the op is FLOAT32 when its attr has one of the values). ``'FLOAT32_INPUTS'`` and
        ``'INDEX_INPUTS'``: ``{op: tuple of input positions}``. ``'EMULATE_FLOAT32'``:
        ``{op: reason}``, ops that compute in float32 when the graph is emulated (empty when the
        dtype has none). A new dict on every call.

    Raises
    ------
    ValueError
        If target_dtype is not one of the two names.
    """
    merged = _merged(target_dtype)
    classes = {name: frozenset(merged[name]) for name in OP_CLASSES}
    conditional = {}
    for op, attr, values in merged['CONDITIONAL_FLOAT32']:
        conditional.setdefault(op, {})[attr] = frozenset(values)
    classes['CONDITIONAL_FLOAT32'] = conditional
    for name in _DICTS:
        classes[name] = dict(merged.get(name, {}))
    return classes


def aliases(target_dtype):
    """``{alias: canonical op}`` of one target dtype's table.

    The alias relation lives only in the tables' comments (``# shape (alias of Reshape)``), so
    this reads the source of ops_shared.py and the dtype's module.

    Raises:
        ValueError: another dtype name.
    """
    import inspect
    import re
    _merged(target_dtype)  # validates the name
    out = {}
    for module in (ops_shared, _DIFFERENCES[target_dtype]):
        for line in inspect.getsource(module).splitlines():
            m = re.match(r"\s+'([^']+)',\s+#.*\(alias of ([^)\s]+)\)", line)
            if m:
                out[m.group(1)] = m.group(2)
    return out
