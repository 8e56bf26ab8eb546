"""contrib.amp's storage rules for variables that feed a model's own casts
(``cast_optional_params=True`` / ``cast_params=True``), for both target dtypes.

MXNet 1.9.1's contrib.amp tests (``test_bf16_casting``, ``test_fp16_casting``) pin three rules;
contrib.amp gets them from a type pass over the variables feeding ``amp_cast``/``amp_multicast``
nodes. mxmp states them as rules of its plan (:mod:`mxmp._src.graph.plan`): a parameter is stored in
the target dtype when every consumer takes it in that dtype, and a model's ``amp_cast`` to the
target dtype takes it so; under :mod:`mxmp.amp`'s policy an ``amp_multicast`` whose inputs are
all variables does too. Checked here node by node: the variables' ``__dtype__``, the casts the
pass adds (mxmp's mark) and the model casts it keeps.
"""
import json

import mxnet as mx
import pytest

import mxmp
from mxmp import amp
from mxmp._src.dtypes import MSHADOW_ENUM, mx_dtype

FLOAT32 = '0'


def nodes_of(sym):
    return json.loads(sym.tojson(remove_amp_cast=False))['nodes']


def variables(sym):
    """{name: __dtype__ attribute or None} of the graph's variables."""
    return {n['name']: n.get('attrs', {}).get('__dtype__')
            for n in nodes_of(sym) if n['op'] == 'null'}


def casts(sym):
    """[(op, name, dtype attribute, input names, written by mxmp)] of every cast node."""
    nodes = nodes_of(sym)
    return [(n['op'], n['name'], n.get('attrs', {}).get('dtype'),
             [nodes[i[0]]['name'] for i in n['inputs']], '__mxmp__' in n.get('attrs', {}))
            for n in nodes if n['op'] in ('amp_cast', 'amp_multicast')]


def lp_var(name, lp):
    return mx.sym.var(name, __dtype__=MSHADOW_ENUM[lp])


def f32_var(name):
    return mx.sym.var(name, dtype='float32')


@pytest.mark.parametrize('lp', ['bfloat16', 'float16'])
def test_a_parameter_only_cast_to_the_target_dtype_is_stored_in_it(lp):
    w = mx.sym.var('w')
    sym = mx.sym.Group([mx.sym.amp_cast(w, dtype=mx_dtype(lp), name='c1'),
                        mx.sym.amp_cast(w, dtype=mx_dtype(lp), name='c2')])
    out = amp.convert_symbol(sym, lp, data_names=[], cast_optional_params=True)
    assert variables(out) == {'w': MSHADOW_ENUM[lp]}
    # The model's casts stay (now no-ops on a tensor stored in their dtype); mxmp adds only
    # the float32 casts of the graph outputs.
    assert casts(out) == [
        ('amp_cast', 'c1', lp, ['w'], False),
        ('amp_cast', 'c1_amp_cast_float32', 'float32', ['c1'], True),
        ('amp_cast', 'c2', lp, ['w'], False),
        ('amp_cast', 'c2_amp_cast_float32', 'float32', ['c2'], True)]
    # mxmp's own pass: the same rule under cast_params=True, nothing without it.
    native = mxmp.convert_symbol(sym, lp, cast_params=True, data_names=())
    assert variables(native) == {'w': MSHADOW_ENUM[lp]}
    assert variables(mxmp.convert_symbol(sym, lp, data_names=())) == {'w': FLOAT32}
    assert variables(amp.convert_symbol(sym, lp, data_names=[])) == {'w': FLOAT32}
    rule = {r.name: r.rule for r in mxmp.explain(sym, lp, cast_params=True, data_names=())}
    assert rule['w'].startswith('parameter stored in %s (cast_params: every consumer takes '
                                'it in %s' % (lp, lp))


@pytest.mark.parametrize('lp', ['bfloat16', 'float16'])
def test_a_parameter_also_cast_to_float32_stays_float32(lp):
    w = mx.sym.var('w')
    sym = mx.sym.Group([mx.sym.amp_cast(w, dtype=mx_dtype(lp), name='c1'),
                        mx.sym.amp_cast(w, dtype='float32', name='c2')])
    out = amp.convert_symbol(sym, lp, data_names=[], cast_optional_params=True)
    assert variables(out) == {'w': FLOAT32}
    assert casts(out) == [
        ('amp_cast', 'c1', lp, ['w'], False),
        ('amp_cast', 'c1_amp_cast_float32', 'float32', ['c1'], True),
        ('amp_cast', 'c2', 'float32', ['w'], False)]


@pytest.mark.parametrize('lp', ['bfloat16', 'float16'])
def test_an_amp_multicast_of_variables_stores_its_float32_parameter_in_the_target_dtype(lp):
    sym = mx.sym.amp_multicast(f32_var('a'), lp_var('b', lp), num_outputs=2, name='mc')
    out = amp.convert_symbol(sym, lp, cast_optional_params=True)
    assert variables(out) == {'a': MSHADOW_ENUM[lp], 'b': MSHADOW_ENUM[lp]}
    # Both inputs arrive in the target dtype, so the multicast's outputs are in it too and
    # mxmp casts them back to float32 at the graph's outputs.
    assert casts(out) == [
        ('amp_multicast', 'mc', None, ['a', 'b'], False),
        ('amp_cast', 'mc_amp_cast_float32', 'float32', ['mc'], True),
        ('amp_cast', 'mc_out1_amp_cast_float32', 'float32', ['mc'], True)]
    types = dict(zip(out.list_arguments(), out.infer_type()[0]))
    assert {k: mxmp._src.dtypes.dtype_name(v) for k, v in types.items()} == {'a': lp, 'b': lp}
    # Not without cast_optional_params; not in mxmp's own pass, where storage never changes
    # what a node computes (the multicast would run in lp instead of float32).
    assert variables(amp.convert_symbol(sym, lp)) == {'a': FLOAT32, 'b': MSHADOW_ENUM[lp]}
    native = mxmp.convert_symbol(sym, lp, cast_params=True, data_names=())
    assert variables(native) == {'a': FLOAT32, 'b': MSHADOW_ENUM[lp]}
    assert casts(native) == [('amp_multicast', 'mc', None, ['a', 'b'], False)]


@pytest.mark.parametrize('lp', ['bfloat16', 'float16'])
def test_a_float32_parameter_cast_and_multicast_is_stored_in_the_target_dtype(lp):
    a = f32_var('a')
    sym = mx.sym.Group([mx.sym.amp_multicast(a, lp_var('b', lp), num_outputs=2, name='mc'),
                        mx.sym.amp_cast(a, dtype=mx_dtype(lp), name='c')])
    out = amp.convert_symbol(sym, lp, target_dtype_ops=[], fp32_ops=[],
                             cast_optional_params=True)
    assert variables(out) == {'a': MSHADOW_ENUM[lp], 'b': MSHADOW_ENUM[lp]}
    assert casts(out) == [
        ('amp_multicast', 'mc', None, ['a', 'b'], False),
        ('amp_cast', 'mc_amp_cast_float32', 'float32', ['mc'], True),
        ('amp_cast', 'mc_out1_amp_cast_float32', 'float32', ['mc'], True),
        ('amp_cast', 'c', lp, ['a'], False),
        ('amp_cast', 'c_amp_cast_float32', 'float32', ['c'], True)]


@pytest.mark.parametrize('lp', ['bfloat16', 'float16'])
def test_a_multicast_with_a_computed_input_stores_nothing(lp):
    """contrib.amp's rule needs every input of the multicast to be a variable."""
    a = f32_var('a')
    summed = mx.sym.elemwise_add(lp_var('b', lp), lp_var('c', lp), name='add')
    sym = mx.sym.amp_multicast(a, summed, num_outputs=2, name='mc')
    out = amp.convert_symbol(sym, lp, target_dtype_ops=[], fp32_ops=[],
                             cast_optional_params=True)
    assert variables(out) == {'a': FLOAT32, 'b': MSHADOW_ENUM[lp], 'c': MSHADOW_ENUM[lp]}


@pytest.mark.parametrize('lp', ['bfloat16', 'float16'])
def test_data_names_default_is_the_inputs_without_a_dtype(lp):
    """As contrib.amp: data_names=None takes every input without ``__dtype__`` as data (never
    stored in low precision, no ``__dtype__`` written); ``[]`` makes every input a parameter."""
    sym = mx.sym.amp_multicast(lp_var('a', lp), f32_var('b'), mx.sym.var('c'),
                               num_outputs=3, name='mc')
    out = amp.convert_symbol(sym, lp, target_dtype_ops=[], fp32_ops=[],
                             cast_optional_params=True)
    assert variables(out) == {'a': MSHADOW_ENUM[lp], 'b': MSHADOW_ENUM[lp], 'c': None}
    every = amp.convert_symbol(sym, lp, data_names=[], cast_optional_params=True)
    assert variables(every) == {'a': MSHADOW_ENUM[lp], 'b': MSHADOW_ENUM[lp],
                                'c': MSHADOW_ENUM[lp]}


@pytest.mark.parametrize('lp', ['bfloat16', 'float16'])
def test_storage_rules_convert_idempotently_and_strip_back(lp):
    a = f32_var('a')
    sym = mx.sym.Group([mx.sym.amp_multicast(a, lp_var('b', lp), num_outputs=2, name='mc'),
                        mx.sym.amp_cast(a, dtype=mx_dtype(lp), name='c')])
    once = amp.convert_symbol(sym, lp, cast_optional_params=True)
    twice = amp.convert_symbol(once, lp, cast_optional_params=True)
    assert once.tojson(remove_amp_cast=False) == twice.tojson(remove_amp_cast=False)
    assert nodes_of(mxmp.remove_casts(once)) == nodes_of(sym)
