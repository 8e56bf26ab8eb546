"""Policy: validation of overrides and the class each op gets."""
import numpy as np
import pytest
from mxnet.contrib.amp.amp import bfloat16

import mxmp
from mxmp._src.policy.policy import FLOAT32, LOW_PRECISION
from mxmp._src.dtypes import normalize_dtype


@pytest.mark.parametrize('spelling, name', [('float16', 'float16'), ('BFloat16', 'bfloat16'),
                                            (np.float16, 'float16'), (bfloat16, 'bfloat16')])
def test_dtype_spellings_normalize_to_the_canonical_name(spelling, name):
    assert normalize_dtype(spelling) == name


@pytest.mark.parametrize('bad', ['int8', 'float64', np.float32, 'fp16'])
def test_unknown_target_dtype_names_the_accepted_ones(bad):
    with pytest.raises(ValueError, match="'float16' or 'bfloat16'"):
        mxmp.Policy(bad)


def test_float32_is_accepted_only_where_asked():
    assert normalize_dtype('float32', allow_float32=True) == 'float32'


def test_unknown_op_name_in_an_override_is_named():
    with pytest.raises(ValueError, match='fp32_ops names ops that MXNet does not register: '
                                         'Convolutoin'):
        mxmp.Policy('float16', fp32_ops=['Convolutoin'])


def test_op_in_both_override_classes_is_named():
    with pytest.raises(ValueError, match='both lp_ops and fp32_ops: softmax'):
        mxmp.Policy('bfloat16', lp_ops=['softmax'], fp32_ops=['softmax'])


def test_a_string_instead_of_a_list_is_rejected():
    with pytest.raises(ValueError, match='list of names'):
        mxmp.Policy('bfloat16', fp32_ops='softmax')


def test_overrides_move_an_op_between_classes():
    policy = mxmp.Policy('float16', lp_ops=['softmax'], fp32_ops=['Convolution'])
    assert policy.classify('softmax') == (LOW_PRECISION, 'lp_ops (user override)')
    assert policy.classify('Convolution') == (FLOAT32, 'fp32_ops (user override)')
    assert 'Convolution' not in policy.ops_in(LOW_PRECISION)
    assert 'softmax' not in policy.ops_in(FLOAT32)


def test_excluded_names_win_over_every_class():
    policy = mxmp.Policy('bfloat16', excluded_names=['stem'])
    assert policy.classify('Convolution', name='stem')[0] == FLOAT32
    assert policy.classify('Convolution', name='other')[0] == LOW_PRECISION


def test_policy_is_immutable_and_hashable():
    policy = mxmp.Policy('bfloat16', fp32_ops=['Pooling'], emulate=False)
    with pytest.raises(Exception):
        policy.target_dtype = 'float16'
    assert hash(policy) == hash(mxmp.Policy('bfloat16', fp32_ops=('Pooling',), emulate=False))
    assert policy.replace(emulate=True).emulate and not policy.emulate
