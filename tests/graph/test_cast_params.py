"""The graph package's layout: the one cast_params test, the parameter arrays that go with a
converted graph."""
import mxnet as mx
import numpy as np

import mxmp
from mxmp._src.dtypes import dtype_name
from mxmp._src.graph import strip, symbol_json
from helpers import conv_bn_relu_fc_softmax, nodes_of


def test_cast_param_names_are_the_variables_the_pass_stores_in_the_target_dtype():
    sym = conv_bn_relu_fc_softmax()
    out = mxmp.convert_symbol(sym, 'bfloat16', cast_params=True)
    # Convolution and FullyConnected are low-precision ops; BatchNorm's parameters stay float32.
    assert symbol_json.cast_param_names(out) == {'conv_weight', 'conv_bias', 'fc_weight',
                                                 'fc_bias'}
    flagged = {n['name'] for n in nodes_of(out) if symbol_json.is_cast_param(n)}
    assert flagged == symbol_json.cast_param_names(out)
    assert symbol_json.cast_param_names(mxmp.convert_symbol(sym, 'bfloat16')) == frozenset()
    assert symbol_json.cast_param_names(mxmp.remove_casts(out)) == frozenset()


def test_arrays_for_graph_cast_the_stored_parameters_only():
    sym = conv_bn_relu_fc_softmax()
    out = mxmp.convert_symbol(sym, 'bfloat16', cast_params=True)
    arrays = {'conv_weight': mx.nd.ones((8, 1, 3, 3)), 'bn_gamma': mx.nd.ones((8,)),
              'fc_weight': mx.nd.ones((10, 8), dtype='float16')}
    got = strip.arrays_for_graph(out, arrays)
    assert {k: dtype_name(v.dtype) for k, v in got.items()} == {
        'conv_weight': 'bfloat16', 'bn_gamma': 'float32', 'fc_weight': 'bfloat16'}
    back = strip.float32_arrays(got)
    assert {dtype_name(v.dtype) for v in back.values()} == {'float32'}
    assert back['bn_gamma'] is got['bn_gamma']   # float32 arrays are not copied
    np.testing.assert_array_equal(back['conv_weight'].asnumpy(), np.ones((8, 1, 3, 3)))

