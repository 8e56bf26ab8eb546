"""mxmp/policy/ops_*.py: shared ops once, each dtype's module holds only real differences."""
import pytest

from mxmp._src.policy import ops_bfloat16, ops_float16, ops_shared, tables

DIFFS = {'float16': ops_float16, 'bfloat16': ops_bfloat16}


def _classes(module):
    """{op: class name} of one ops_*.py module, with the aliases of its ops (they follow them)."""
    listed = {op: name for name in tables.OP_CLASSES
              for op in tables.ops_of(getattr(module, name, {}))}
    return dict(listed, **{alias: listed[op] for alias, op in tables.registered_aliases().items()
                           if op in listed and tables.excluded_reason(alias) is None})


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
    follow = dict(ops_float16.FOLLOW, math=ops_float16.FOLLOW['math'] + ('relu',))
    monkeypatch.setattr(ops_float16, 'FOLLOW', follow)  # relu: shared FOLLOW
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


@pytest.mark.parametrize('module', [ops_shared, ops_float16, ops_bfloat16])
def test_no_op_module_lists_an_alias(module):
    # Aliases follow their canonical op (MXNet's registry); a listed one could contradict it.
    listed = {op for name in tables.OP_CLASSES for op in tables.ops_of(getattr(module, name, {}))}
    listed |= {op for op, _, _ in getattr(module, 'CONDITIONAL_FLOAT32', ())}
    listed |= {op for name in ('FLOAT32_INPUTS', 'INDEX_INPUTS', 'EMULATE_FLOAT32')
               for op in getattr(module, name, {})}
    assert listed and not listed & set(tables.registered_aliases())


@pytest.mark.parametrize('target', sorted(DIFFS))
def test_an_alias_is_classified_as_its_canonical_op(target):
    classes, table = _classes(ops_shared), tables.table(target)
    classes.update(_classes(DIFFS[target]))
    named = tables.registered_aliases()
    classified = {alias: op for alias, op in named.items() if tables.excluded_reason(alias) is None}
    assert classified and all(classes.get(alias) == classes.get(op)
                              for alias, op in classified.items())
    assert tables.aliases(target) == {a: op for a, op in classified.items() if op in classes}
    dot_class = {'float16': 'LOW_PRECISION', 'bfloat16': 'FLOAT32'}[target]
    assert named['_sparse_dot'] == 'dot' and '_sparse_dot' in table[dot_class]
    assert 'random_pdf_negative_binomial' in table['FLOAT32']   # alias of _random_pdf_...
    assert table['INDEX_INPUTS']['_sparse_where'] == table['INDEX_INPUTS']['where'] == (0,)
    assert named['_npx_convolution'] == 'Convolution'            # excluded by its prefix
    assert not any('_npx_convolution' in table[name] for name in tables.OP_CLASSES)
