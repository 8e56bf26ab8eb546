"""mxmp/policy/ops_*.py: shared ops once, each dtype's module holds only real differences."""
import pytest

from mxmp._src.policy import ops_bfloat16, ops_float16, ops_shared, tables

DIFFS = {'float16': ops_float16, 'bfloat16': ops_bfloat16}


def _classes(module):
    """{op: class name} of one ops_*.py module."""
    return {op: name for name in tables.OP_CLASSES for op in getattr(module, name, ())}


def test_dtype_modules_list_only_ops_whose_class_differs():
    fp16, bf16 = _classes(ops_float16), _classes(ops_bfloat16)
    assert set(fp16) == set(bf16)  # an op that differs is listed in both dtype modules
    same = sorted(op for op in fp16 if fp16[op] == bf16[op])
    assert not same, 'same class for both dtypes: move to ops_shared.py: %s' % same


@pytest.mark.parametrize('target', sorted(DIFFS))
def test_no_op_is_both_shared_and_dtype_specific(target):
    shared = set(_classes(ops_shared))
    assert not shared & set(_classes(DIFFS[target]))
    for name in ('FLOAT32_INPUTS', 'INDEX_INPUTS', 'EMULATE_FLOAT32'):
        assert not set(getattr(ops_shared, name, {})) & set(getattr(DIFFS[target], name, {}))
    rules = {(op, attr) for op, attr, _ in getattr(DIFFS[target], 'CONDITIONAL_FLOAT32', ())}
    assert not rules & {(op, attr) for op, attr, _ in ops_shared.CONDITIONAL_FLOAT32}


@pytest.mark.parametrize('target', sorted(DIFFS))
def test_table_is_shared_plus_differences(target):
    table = tables.table(target)
    merged = dict(_classes(ops_shared), **_classes(DIFFS[target]))
    assert {op: name for name in tables.OP_CLASSES for op in table[name]} == merged
    classes = tables.classes_for(target)
    assert all(classes[name] == frozenset(table[name]) for name in tables.OP_CLASSES)


def test_an_op_listed_twice_is_refused(monkeypatch):
    monkeypatch.setattr(ops_float16, 'FOLLOW', ops_float16.FOLLOW + ('relu',))  # shared FOLLOW
    tables.table.cache_clear()
    try:
        with pytest.raises(ValueError, match='relu is listed twice for float16'):
            tables.table('float16')
    finally:
        monkeypatch.undo()
        tables.table.cache_clear()
    assert 'relu' in tables.table('float16')['FOLLOW']


def test_aliases_come_from_both_modules():
    aliases = tables.aliases('bfloat16')
    assert aliases['_sparse_FullyConnected'] == 'FullyConnected'   # ops_shared.py
    assert aliases['_sparse_square'] == 'square'                    # ops_bfloat16.py
    with pytest.raises(ValueError, match='float16" or "bfloat16'):
        tables.aliases('float32')
