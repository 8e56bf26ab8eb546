"""mxmp._src.dtypes speaks MXNet's dtype names and enums; mxmp._src.errors.mxnet_error_line finds the
reason in an MXNetError's text."""
import mxnet as mx
import numpy as np
import pytest
from mxnet.contrib.amp.amp import bfloat16

import mxmp
from mxmp._src import dtypes
from mxmp._src.errors import mxnet_error_line


@pytest.mark.parametrize('given, name', [
    ('bfloat16', 'bfloat16'), (bfloat16, 'bfloat16'), (np.float16, 'float16'),
    ('float32', 'float32'), (np.dtype('float64'), 'float64'), ('int32', 'int32'), (None, None)])
def test_dtype_name_gives_one_spelling_for_every_form(given, name):
    assert dtypes.dtype_name(given) == name


def test_the_mshadow_enum_is_the_one_mxnet_writes_into_graphs():
    from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX
    for np_type, value in _DTYPE_NP_TO_MX.items():
        if np_type is None:
            continue
        name = dtypes.dtype_name(np_type)
        assert dtypes.MSHADOW_ENUM[name] == str(value), name
        assert dtypes.from_mshadow_enum(value) == name
    # a variable pinned through the table binds in plain MXNet with that dtype
    for name in ('float16', 'bfloat16', 'float64'):
        var = mx.sym.var('x', dtype=dtypes.mx_dtype(name))
        assert var.attr('__dtype__') == dtypes.MSHADOW_ENUM[name]


def test_itemsize_and_low_precision():
    assert [dtypes.itemsize(d) for d in ('bfloat16', 'float16', 'float32', bfloat16)] == \
        [2, 2, 4, 2]
    assert dtypes.is_low_precision(bfloat16) and dtypes.is_low_precision('float16')
    assert not dtypes.is_low_precision('float32')


def test_normalize_dtype_names_the_accepted_dtypes():
    assert dtypes.normalize_dtype('BFloat16') == 'bfloat16'
    assert dtypes.normalize_dtype(np.float32, allow_float32=True) == 'float32'
    with pytest.raises(ValueError, match="'float16' or 'bfloat16'"):
        dtypes.normalize_dtype('float32')
    with pytest.raises(ValueError, match='unknown target dtype'):
        dtypes.normalize_dtype(object())


def test_convert_to_float32_raises_with_the_fix_and_leaves_the_block_alone():
    # not a silent no-op: float32 is no mixed-precision target; the message says the network
    # needs no conversion and where mxmp's kernels come with (bfloat16) or are measured
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Dense(8), nn.LayerNorm(), nn.Dropout(0.1))
    net.initialize(mx.init.Xavier())
    x = mx.nd.ones((2, 4))
    before = net(x).asnumpy()
    for spelling in ('float32', np.float32, 'FLOAT32'):
        with pytest.raises(ValueError, match="'float32' is not a mixed-precision target.*"
                           "needs no conversion.*mxmp.convert\\(net, 'bfloat16'\\)"):
            mxmp.convert(net, spelling)
    np.testing.assert_array_equal(net(x).asnumpy(), before)
    with pytest.raises(RuntimeError, match='no mixed-precision graph'):
        mxmp.converted_graph(net)   # no hook was left on it


def test_mxnet_error_line_is_the_reason_not_the_cpp_traceback():
    a = mx.nd.ones((2, 3))
    with pytest.raises(mx.base.MXNetError) as info:
        mx.nd.dot(a, a).wait_to_read()
    line = mxnet_error_line(info.value)
    assert '\n' not in line and not line.startswith(('MXNetError', 'Check failed', '[bt]'))
    assert 'dot' in line.lower() or 'shape' in line.lower(), line
    assert len(mxnet_error_line(info.value, limit=20)) <= 20
    assert mxnet_error_line(ValueError()) == 'ValueError'
