"""Tests for the op tables (mxmp/_src/policy/): the operator classes per target dtype.

They pin down that every operator MXNet 1.9.1 registers is classified once per target dtype (or
excluded by a documented rule), that the lists name real operators, attributes and input
positions, that the FOLLOW/WIDEST_TYPE ops really keep float16 (and bfloat16) on CPU, and the
classification facts the README states (softmax, norms, reductions float32; gemm ops low
precision; BatchNorm's parameters float32). Operator metadata comes from MXNet's C API
(MXSymbolGetAtomicSymbolInfo, NNGetOpHandle), the same data ``mx.sym`` builds its docs from.
"""
import ctypes
import json
import re
from array import array

import types

import numpy as np
import pytest

import mxnet as mx
from mxnet.base import OpHandle, _LIB, c_array_buf, c_str, c_str_array, check_call, mx_uint, py_str
from mxnet.contrib.amp.amp import bfloat16


import mxmp._src.policy.tables

# mx.nd.array checks for scipy's csr_matrix through a namespace newer scipy deprecates.
pytestmark = pytest.mark.filterwarnings('ignore:Please use `csr_matrix`:DeprecationWarning')

#: Each target dtype's merged op table (ops_shared.py + ops_<dtype>.py), as attributes.
MODULES = {t: types.SimpleNamespace(**mxmp._src.policy.tables.table(t))
           for t in ('float16', 'bfloat16')}
TARGETS = tuple(MODULES)
CLASSES = mxmp._src.policy.tables.OP_CLASSES
# mxmp's operator library adds its ops to the registry when it loads (any conversion of a graph
# with LayerNorm loads it): load it here first, so the registry is the same in every test order.
from mxmp._src.kernels.build import NO_BACKWARD_OPS, OPS as LIBRARY_OPS, load_library  # noqa
LIBRARY = len(LIBRARY_OPS) if load_library() is not None else 0   # ops it registers
LIBRARY_BACKWARD = LIBRARY - len(NO_BACKWARD_OPS) if LIBRARY else 0   # and their _backward_
REGISTERED = sorted(mx.operator.get_all_registered_operators())
CLASSIFIED = [name for name in REGISTERED if mxmp._src.policy.tables.excluded_reason(name) is None]
MX_DTYPE_ENUM = {'float32': 0, 'float16': 2, 'int32': 4, 'bfloat16': 12}


# ----------------------------------------------------------------------------------------------
# operator metadata from the C API
def _op_handle(name):
    handle = OpHandle()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    return handle.value


def _op_info(name):
    """(canonical name, [(argument name, type string)], key_var_num_args) of a registered op."""
    handle = OpHandle()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    real_name, desc, key_var, ret_type = (ctypes.c_char_p() for _ in range(4))
    num_args = mx_uint()
    arg_names, arg_types, arg_descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    check_call(_LIB.MXSymbolGetAtomicSymbolInfo(
        handle, ctypes.byref(real_name), ctypes.byref(desc), ctypes.byref(num_args),
        ctypes.byref(arg_names), ctypes.byref(arg_types), ctypes.byref(arg_descs),
        ctypes.byref(key_var), ctypes.byref(ret_type)))
    args = [(py_str(arg_names[i]), py_str(arg_types[i])) for i in range(num_args.value)]
    return py_str(real_name.value), args, py_str(key_var.value) if key_var.value else None


def _infer_type(sym, **known):
    """Symbol.infer_type with MXNet dtype enums, so that bfloat16 (enum 12) can be passed."""
    sizes = [mx_uint() for _ in range(3)]
    data = [ctypes.POINTER(ctypes.c_int)() for _ in range(3)]
    complete = ctypes.c_int()
    check_call(_LIB.MXSymbolInferTypePartial(
        sym.handle, mx_uint(len(known)), c_str_array(list(known)),
        c_array_buf(ctypes.c_int, array('i', [MX_DTYPE_ENUM[v] for v in known.values()])),
        ctypes.byref(sizes[0]), ctypes.byref(data[0]), ctypes.byref(sizes[1]),
        ctypes.byref(data[1]), ctypes.byref(sizes[2]), ctypes.byref(data[2]),
        ctypes.byref(complete)))
    names = {v: k for k, v in MX_DTYPE_ENUM.items()}
    return tuple([names.get(data[k][i], data[k][i]) for i in range(sizes[k].value)]
                 for k in range(3))


def _function(namespace, name):
    """The mx.nd or mx.sym function of a registered op name (prefixed ops live in submodules)."""
    modules = [namespace, namespace._internal, namespace.contrib, namespace.sparse,
               namespace.linalg, namespace.random, namespace.image, namespace.op]
    for module in modules:
        if hasattr(module, name):
            return getattr(module, name)
    for prefix, module in (('_contrib_', namespace.contrib), ('_sparse_', namespace.sparse),
                           ('_random_', namespace.random)):
        if name.startswith(prefix) and hasattr(module, name[len(prefix):]):
            return getattr(module, name[len(prefix):])
    raise LookupError('no %s function for op %s' % (namespace.__name__, name))


def _class_of(target, name):
    module = MODULES[target]
    found = [cls for cls in CLASSES if name in getattr(module, cls)]
    return found[0] if len(found) == 1 else found


def _op_node_input_names(sym):
    graph = json.loads(sym.tojson())
    node = [n for n in graph['nodes'] if n['op'] != 'null'][-1]
    return [graph['nodes'][i]['name'] for i, _, _ in node['inputs']]


# ----------------------------------------------------------------------------------------------
# coverage, disjointness, names
@pytest.mark.parametrize('target', TARGETS)
def test_every_registered_op_is_classified_or_excluded_by_a_rule(target):
    module = MODULES[target]
    classified = set().union(*(getattr(module, cls) for cls in CLASSES))
    missing = [name for name in CLASSIFIED if name not in classified]
    assert not missing, '%d registered ops have no %s class and match no exclusion rule: %s' % (
        len(missing), target, missing)
    assert len(REGISTERED) == 1167 + LIBRARY + LIBRARY_BACKWARD   # the library's


@pytest.mark.parametrize('target', TARGETS)
def test_excluded_ops_are_in_no_class(target):
    module = MODULES[target]
    both = [name for name in REGISTERED if mxmp._src.policy.tables.excluded_reason(name) is not None
            and any(name in getattr(module, cls) for cls in CLASSES)]
    assert not both


@pytest.mark.parametrize('target', TARGETS)
def test_classes_are_pairwise_disjoint(target):
    module = MODULES[target]
    for i, first in enumerate(CLASSES):
        for second in CLASSES[i + 1:]:
            common = set(getattr(module, first)) & set(getattr(module, second))
            assert not common, '%s in both %s and %s' % (sorted(common), first, second)


@pytest.mark.parametrize('target', TARGETS)
def test_class_tuples_are_sorted_without_duplicates(target):
    module = MODULES[target]
    for cls in CLASSES:
        names = getattr(module, cls)
        assert isinstance(names, tuple)
        assert list(names) == sorted(set(names)), cls


@pytest.mark.parametrize('target', TARGETS)
def test_every_listed_name_is_a_registered_op(target):
    module = MODULES[target]
    listed = set().union(*(getattr(module, cls) for cls in CLASSES))
    listed |= {op for op, _, _ in module.CONDITIONAL_FLOAT32}
    listed |= set(module.FLOAT32_INPUTS) | set(module.INDEX_INPUTS)
    unknown = sorted(listed - set(REGISTERED))
    assert not unknown, 'not registered in MXNet %s: %s' % (mx.__version__, unknown)


def test_each_exclusion_rule_matches_registered_ops():
    for prefix, reason in mxmp._src.policy.tables.EXCLUDED_PREFIXES:
        assert reason and (any(name.startswith(prefix) for name in REGISTERED) or
                           (prefix == 'mxmp_' and not LIBRARY)), prefix
    counts = {prefix: sum(1 for n in REGISTERED if mxmp._src.policy.tables.excluded_reason(n) == reason)
              for prefix, reason in mxmp._src.policy.tables.EXCLUDED_PREFIXES}
    assert counts == {'_backward_': 265 + LIBRARY_BACKWARD, '_contrib_backward_': 4, '_np_': 25,
                      '_npi_': 207, '_npx_': 54, 'mxmp_': LIBRARY, 'amp_': 2}


def test_legacy_cumsum_is_classified_under_its_numpy_canonical_name():
    # mx.sym.cumsum serializes as _np_cumsum, so the pass must find that name in the lists.
    data = mx.sym.var('data')
    ops = [n['op'] for n in json.loads(mx.sym.cumsum(data).tojson())['nodes']]
    assert '_np_cumsum' in ops
    assert mxmp._src.policy.tables.excluded_reason('_np_cumsum') is None
    assert mxmp._src.policy.tables.excluded_reason('_np_sum') is not None
    for target in TARGETS:
        assert _class_of(target, '_np_cumsum') == 'FLOAT32'


@pytest.mark.parametrize('target', TARGETS)
def test_all_registered_names_of_one_operator_share_class_and_input_rules(target):
    module = MODULES[target]
    groups = {}
    for name in CLASSIFIED:
        groups.setdefault(_op_handle(name), []).append(name)
    conditional = {op: (attr, values) for op, attr, values in module.CONDITIONAL_FLOAT32}
    for names in groups.values():
        if len(names) == 1:
            continue
        assert len({str(_class_of(target, n)) for n in names}) == 1, names
        for table in (module.FLOAT32_INPUTS, module.INDEX_INPUTS, conditional):
            assert len({repr(table.get(n)) for n in names}) == 1, (names, table)


# ----------------------------------------------------------------------------------------------
# conditional rules and input positions
@pytest.mark.parametrize('target', TARGETS)
def test_conditional_rules_name_an_op_of_another_class_and_its_real_attr_values(target):
    module = MODULES[target]
    assert module.CONDITIONAL_FLOAT32
    for op, attr, values in module.CONDITIONAL_FLOAT32:
        assert _class_of(target, op) in ('LOW_PRECISION', 'WIDEST_TYPE', 'FOLLOW'), op
        args = dict(_op_info(op)[1])
        assert attr in args, '%s has no attribute %s' % (op, attr)
        allowed = set(re.findall(r"'([^']*)'", args[attr].split('}')[0]))
        assert values and set(values) <= allowed, (op, attr, values, allowed)


def test_activation_softrelu_is_float32_for_both_targets():
    for target in TARGETS:
        rule = mxmp._src.policy.tables.classes_for(target)['CONDITIONAL_FLOAT32']['Activation']
        assert 'softrelu' in rule['act_type']
        assert 'relu' not in rule['act_type']


# op -> (attributes needed to build it with all its optional inputs, expected input names)
INPUT_POSITION_RECIPES = {
    'BatchNorm': ({}, {1: 'gamma', 2: 'beta', 3: 'moving_mean', 4: 'moving_var'}),
    '_contrib_BatchNormWithReLU': ({}, {1: 'gamma', 2: 'beta', 3: 'moving_mean',
                                        4: 'moving_var'}),
    'CTCLoss': ({'use_data_lengths': True, 'use_label_lengths': True},
                {1: 'label', 2: 'data_lengths', 3: 'label_lengths'}),
    'Embedding': ({'input_dim': 4, 'output_dim': 3}, {0: 'data'}),
    '_contrib_SparseEmbedding': ({'input_dim': 4, 'output_dim': 3}, {0: 'data'}),
    'RNN': ({'mode': 'lstm', 'state_size': 4, 'num_layers': 1, 'use_sequence_length': True},
            {4: 'sequence_length'}),
    'SequenceLast': ({'use_sequence_length': True}, {1: 'sequence_length'}),
    'SequenceMask': ({'use_sequence_length': True}, {1: 'sequence_length'}),
    'SequenceReverse': ({'use_sequence_length': True}, {1: 'sequence_length'}),
    '_contrib_BilinearResize2D': ({'mode': 'like'}, {1: 'like'}),
    '_contrib_boolean_mask': ({}, {1: 'index'}),
    '_contrib_index_copy': ({}, {1: 'index_vector'}),
    '_ravel_multi_index': ({'shape': (2, 3)}, {0: 'data'}),
    '_unravel_index': ({'shape': (2, 3)}, {0: 'data'}),
    '_scatter_set_nd': ({'shape': (2, 3)}, {2: 'indices'}),
    '_sparse_retain': ({}, {1: 'indices'}),
    'batch_take': ({}, {1: 'indices'}),
    'broadcast_like': ({}, {1: 'rhs'}),
    'reshape_like': ({}, {1: 'rhs'}),
    'slice_like': ({}, {1: 'shape_like'}),
    'gather_nd': ({}, {1: 'indices'}),
    'one_hot': ({'depth': 3}, {0: 'indices'}),
    'pick': ({}, {1: 'index'}),
    'scatter_nd': ({'shape': (2, 3)}, {1: 'indices'}),
    'softmax': ({'use_length': True}, {1: 'length'}),
    'take': ({}, {1: 'indices'}),
    'where': ({}, {0: 'condition'}),
}


@pytest.mark.parametrize('target', TARGETS)
@pytest.mark.parametrize('table', ['FLOAT32_INPUTS', 'INDEX_INPUTS'])
def test_input_positions_are_valid_and_name_the_intended_inputs(target, table):
    for op, positions in getattr(MODULES[target], table).items():
        canonical = _op_info(op)[0]
        assert canonical in INPUT_POSITION_RECIPES, 'add a build recipe for %s' % op
        attrs, expected = INPUT_POSITION_RECIPES[canonical]
        inputs = _op_node_input_names(_function(mx.sym, op)(name='op', **attrs))
        assert positions and all(0 <= p < len(inputs) for p in positions), (op, inputs)
        assert {p: inputs[p] for p in positions} == {p: 'op_' + n for p, n in expected.items()}


@pytest.mark.parametrize('target', TARGETS)
def test_float32_inputs_are_the_inputs_mxnet_infers_float32_for_low_precision_data(target):
    module = MODULES[target]
    for op, positions in module.FLOAT32_INPUTS.items():
        assert _class_of(target, op) in ('LOW_PRECISION', 'WIDEST_TYPE', 'FOLLOW'), op
        sym = _function(mx.sym, op)(name='op', **INPUT_POSITION_RECIPES[_op_info(op)[0]][0])
        args, _, aux = _infer_type(sym, op_data=target)
        inferred = dict(zip(sym.list_arguments() + sym.list_auxiliary_states(), args + aux))
        inputs = _op_node_input_names(sym)
        assert [inferred[inputs[p]] for p in positions] == ['float32'] * len(positions), op
        others = [inferred[name] for p, name in enumerate(inputs) if p not in positions]
        assert others == [target] * len(others), op


# ----------------------------------------------------------------------------------------------
# the classification facts of the README (which op class each family of ops is in)
@pytest.mark.parametrize('target', TARGETS)
def test_convolution_deconvolution_fully_connected_run_in_low_precision(target):
    for op in ('Convolution', 'FullyConnected') + (('Deconvolution',) if target == 'float16'
                                                   else ()):
        assert _class_of(target, op) == 'LOW_PRECISION', op


def test_ops_that_crash_or_are_wrong_on_real_bfloat16_kernels_are_float32():
    # `mxmp check-kernels` on avx512_bf16 (docs/conformance.md): transpose corrupts the heap,
    # Deconvolution segfaults in training, the rest miss the tolerance.
    for op in ('transpose', 'Deconvolution', 'broadcast_mul', 'broadcast_div', '_mod',
               '_contrib_AdaptiveAvgPooling2D', '_contrib_BilinearResize2D', 'gather_nd'):
        assert _class_of('bfloat16', op) == 'FLOAT32', op


def test_rnn_dot_batch_dot_are_low_precision_for_float16_and_float32_for_bfloat16():
    # MXNet 1.9.1 has float16 kernels for them (cuDNN/cuBLAS) but no bfloat16 kernel.
    for op in ('RNN', 'dot', 'batch_dot'):
        assert _class_of('float16', op) == 'LOW_PRECISION', op
        assert _class_of('bfloat16', op) == 'FLOAT32', op


@pytest.mark.parametrize('target', TARGETS)
def test_softmax_norms_reductions_exp_log_compute_in_float32(target):
    for op in ('softmax', 'log_softmax', 'LayerNorm', 'InstanceNorm', 'GroupNorm',
               'L2Normalization', 'sum', 'mean', 'exp', 'log', '_power', 'norm'):
        assert _class_of(target, op) == 'FLOAT32', op


@pytest.mark.parametrize('target', TARGETS)
def test_loss_heads_are_loss_output(target):
    for op in ('SoftmaxOutput', 'Softmax', 'LinearRegressionOutput', 'LogisticRegressionOutput',
               'MAERegressionOutput', 'SVMOutput', 'MakeLoss', 'ctc_loss', '_contrib_CTCLoss'):
        assert _class_of(target, op) == 'LOSS_OUTPUT', op


@pytest.mark.parametrize('target', TARGETS)
def test_binary_elementwise_concat_add_n_cast_to_the_widest_type(target):
    for op in ('elemwise_add', '_plus', '_Plus', 'broadcast_add', 'Concat', 'concat', 'add_n',
               'ElementWiseSum', 'stack', 'where'):
        assert _class_of(target, op) == 'WIDEST_TYPE', op


@pytest.mark.parametrize('target', TARGETS)
def test_relu_pooling_flatten_reshape_batchnorm_follow_their_input(target):
    for op in ('relu', 'Activation', 'Pooling', 'Flatten', 'Reshape', 'SwapAxis', 'slice',
               'BatchNorm') + (('transpose',) if target == 'float16' else ()):
        assert _class_of(target, op) == 'FOLLOW', op


def test_dropout_follows_in_float16_and_is_float32_in_bfloat16_which_has_no_kernel():
    assert _class_of('float16', 'Dropout') == 'FOLLOW'
    assert _class_of('bfloat16', 'Dropout') == 'FLOAT32'


@pytest.mark.parametrize('target', TARGETS)
def test_index_valued_outputs_stay_float32(target):
    # float16 holds integers exactly only up to 2048, bfloat16 only up to 256.
    for op in ('argmax', 'argmin', 'topk', '_contrib_arange_like'):
        assert _class_of(target, op) == 'FLOAT32', op


@pytest.mark.parametrize('target', TARGETS)
def test_batchnorm_parameters_and_moving_stats_stay_float32(target):
    assert MODULES[target].FLOAT32_INPUTS['BatchNorm'] == (1, 2, 3, 4)
    # BatchNormType (src/operator/nn/batch_norm.cc) infers float32 parameters for this data.
    sym = mx.sym.BatchNorm(mx.sym.var('data'), name='bn')
    args, outs, aux = _infer_type(sym, data=target)
    assert args == [target, 'float32', 'float32'] and aux == ['float32', 'float32']
    assert outs == [target]


def test_batchnorm_runs_in_float16_with_float32_parameters_on_cpu():
    rng = np.random.RandomState(0)
    data = rng.uniform(-2, 2, size=(2, 8, 3, 3)).astype(np.float32)
    params = [mx.nd.array(rng.uniform(0.5, 1.5, size=8)) for _ in range(4)]
    ref = mx.nd.BatchNorm(mx.nd.array(data), *params, fix_gamma=False, use_global_stats=True)
    out = mx.nd.BatchNorm(mx.nd.array(data, dtype='float16'), *params, fix_gamma=False,
                          use_global_stats=True)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.asnumpy().astype(np.float32), ref.asnumpy(), rtol=2e-3,
                               atol=2e-3)


def test_classes_for_returns_frozensets_and_rejects_other_dtypes():
    classes = mxmp._src.policy.tables.classes_for('bfloat16')
    assert classes['FOLLOW'] == frozenset(MODULES['bfloat16'].FOLLOW)
    assert classes['CONDITIONAL_FLOAT32']['Pooling'] == {'pool_type': frozenset({'lp', 'sum'})}
    assert classes['INDEX_INPUTS']['take'] == (1,)
    with pytest.raises(ValueError, match='float16.*bfloat16'):
        mxmp._src.policy.tables.classes_for('float32')


# ----------------------------------------------------------------------------------------------
# FOLLOW / WIDEST_TYPE ops run in the target dtype on CPU
def LP(*shape):
    """A float input in the target dtype, values in [0.5, 1)."""
    return ('float', shape)


def F32(*shape):
    """A float32 input (FLOAT32_INPUTS)."""
    return ('float32', shape)


def IDX(values, dtype='float32'):
    """An index/length/mask input that keeps its own dtype (INDEX_INPUTS)."""
    return ('index', values, dtype)


def CONST(values):
    """Constant values (coordinates, rois) in the target dtype."""
    return ('const', values)


ROI = CONST([[0, 0, 0, 3, 3]])
# canonical op -> (inputs, attributes), or {target: (inputs, attributes)}; ops not here are run
# with one (2, 3) input per argument (two for a variadic argument).
RUN_SPECS = {
    'Activation': ([LP(2, 3)], {'act_type': 'tanh'}),
    'BatchNorm': ([LP(2, 8, 3, 3), F32(8), F32(8), F32(8), F32(8)], {}),
    '_contrib_BatchNormWithReLU': ([LP(2, 8, 3, 3), F32(8), F32(8), F32(8), F32(8)], {}),
    'BilinearSampler': ([LP(1, 2, 4, 4), LP(1, 2, 4, 4)], {}),
    'Concat': ([LP(2, 3), LP(2, 3)], {'num_args': 2, 'dim': 1}),
    'Correlation': ([LP(1, 2, 6, 6), LP(1, 2, 6, 6)],
                    {'kernel_size': 1, 'max_displacement': 1, 'pad_size': 1}),
    'Embedding': ([IDX([[0, 2]]), LP(4, 5)], {'input_dim': 4, 'output_dim': 5}),
    '_contrib_SparseEmbedding': ([IDX([[0, 2]]), LP(4, 5)], {'input_dim': 4, 'output_dim': 5}),
    'LRN': ([LP(1, 4, 3, 3)], {'nsize': 3}),
    # prelu has a second float input; bfloat16 prelu is float32 by CONDITIONAL_FLOAT32.
    'LeakyReLU': {'float16': ([LP(2, 3), LP(3)], {'act_type': 'prelu'}),
                  'bfloat16': ([LP(2, 3)], {'act_type': 'gelu'})},
    'Pad': ([LP(1, 1, 3, 3)], {'mode': 'constant', 'pad_width': (0, 0, 0, 0, 1, 1, 1, 1)}),
    'Pooling': ([LP(1, 2, 4, 4)], {'kernel': (2, 2), 'pool_type': 'max'}),
    'Pooling_v1': ([LP(1, 2, 4, 4)], {'kernel': (2, 2), 'pool_type': 'max'}),
    'ROIPooling': ([LP(1, 2, 6, 6), ROI], {'pooled_size': (2, 2), 'spatial_scale': 1.0}),
    '_contrib_ROIAlign': ([LP(1, 2, 6, 6), ROI], {'pooled_size': (2, 2), 'spatial_scale': 1.0}),
    '_contrib_PSROIPooling': ([LP(1, 8, 6, 6), ROI],
                              {'spatial_scale': 1.0, 'output_dim': 2, 'pooled_size': 2}),
    '_contrib_RROIAlign': ([LP(1, 2, 6, 6), CONST([[0, 3, 3, 2, 2, 0]])],
                           {'pooled_size': (2, 2), 'spatial_scale': 1.0}),
    'Reshape': ([LP(2, 3)], {'shape': (3, 2)}),
    'SequenceLast': ([LP(3, 2, 4), IDX([2, 3])], {'use_sequence_length': True}),
    'SequenceMask': ([LP(3, 2, 4), IDX([2, 3])], {'use_sequence_length': True}),
    'SequenceReverse': ([LP(3, 2, 4), IDX([2, 3])], {'use_sequence_length': True}),
    'SliceChannel': ([LP(2, 4)], {'num_outputs': 2}),
    'UpSampling': ([LP(1, 2, 3, 3), LP(1, 2, 6, 6)],
                   {'scale': 2, 'sample_type': 'nearest', 'num_args': 2}),
    '_contrib_AdaptiveAvgPooling2D': ([LP(1, 2, 4, 4)], {'output_size': 2}),
    '_contrib_BilinearResize2D': ([LP(1, 2, 3, 3), IDX(np.ones((1, 2, 5, 5)))], {'mode': 'like'}),
    '_contrib_boolean_mask': ([LP(3, 2), IDX([1, 0, 1])], {}),
    '_contrib_gradientmultiplier': ([LP(2, 3)], {'scalar': 0.5}),
    '_contrib_index_copy': ([LP(4, 3), IDX([0, 2]), LP(2, 3)], {}),
    '_copyto': ([LP(2, 3)], {'out': 'zeros'}),
    '_rnn_param_concat': ([LP(4), LP(6)], {'num_args': 2, 'dim': 0}),
    '_scatter_set_nd': ([LP(3, 3), LP(2), IDX([[0, 1], [1, 2]])], {'shape': (3, 3), 'out': 0}),
    '_slice_assign': ([LP(3, 3), LP(1, 3)], {'begin': (0, 0), 'end': (1, 3)}),
    '_slice_assign_scalar': ([LP(3, 3)], {'begin': (0, 0), 'end': (1, 3), 'scalar': 1.0}),
    '_split_v2': ([LP(4, 3)], {'indices': (0, 2), 'axis': 0}),
    'add_n': ([LP(2, 3), LP(2, 3)], {}),
    'batch_take': ([LP(2, 3), IDX([0, 2], 'int32')], {}),
    'broadcast_axis': ([LP(2, 1)], {'axis': 1, 'size': 3}),
    'broadcast_like': ([LP(2, 1), IDX(np.ones((2, 3)))], {}),
    'broadcast_to': ([LP(2, 1)], {'shape': (2, 3)}),
    'Cast': ([LP(2, 3)], {'dtype': 'target'}),
    'cast_storage': ([LP(2, 3)], {'stype': 'default'}),
    'clip': ([LP(2, 3)], {'a_min': 0.6, 'a_max': 0.9}),
    'col2im': ([LP(1, 8, 4)], {'output_size': (3, 3), 'kernel': (2, 2)}),
    'im2col': ([LP(1, 2, 3, 3)], {'kernel': (2, 2)}),
    'depth_to_space': ([LP(1, 4, 2, 2)], {'block_size': 2}),
    'space_to_depth': ([LP(1, 1, 4, 4)], {'block_size': 2}),
    'diag': ([LP(3, 3)], {}),
    'expand_dims': ([LP(2, 3)], {'axis': 0}),
    'gather_nd': ([LP(2, 3), IDX([[0, 1], [1, 2]])], {}),
    'pick': ([LP(2, 3), IDX([0, 2])], {}),
    'repeat': ([LP(2, 3)], {'repeats': 2}),
    'reshape_like': ([LP(2, 3), IDX(np.ones((3, 2)))], {}),
    'reverse': ([LP(2, 3)], {'axis': 1}),
    'scatter_nd': ([LP(2), IDX([[0, 1], [1, 2]])], {'shape': (3, 3)}),
    'slice': ([LP(3, 3)], {'begin': (0, 0), 'end': (2, 2)}),
    'slice_axis': ([LP(3, 3)], {'axis': 0, 'begin': 0, 'end': 2}),
    'slice_like': ([LP(3, 3), IDX(np.ones((2, 2)))], {}),
    'stack': ([LP(2, 3), LP(2, 3)], {'num_args': 2}),
    'take': ([LP(3, 3), IDX([0, 2])], {}),
    'tile': ([LP(2, 3)], {'reps': (2, 1)}),
    'where': ([IDX([[1, 0, 1], [0, 1, 0]]), LP(2, 3), LP(2, 3)], {}),
}
# canonical FOLLOW/WIDEST_TYPE ops that cannot be called through mx.nd
NOT_RUN = {
    '_CrossDeviceCopy': 'inserted by the executor between devices; mx.nd cannot pass it an input',
}
# oneDNN-only bfloat16 kernels: on a CPU without avx512_bf16 creating the primitive fails, which
# still shows that MXNet dispatches bfloat16 to oneDNN for them.
ONEDNN_BF16 = {'Activation', 'LeakyReLU', 'Pooling', 'LRN', 'BatchNorm',
               '_contrib_BatchNormWithReLU'}
ONEDNN_UNAVAILABLE = 'could not create a primitive descriptor iterator'


def _auto_spec(op):
    _, args, key_var = _op_info(op)
    inputs = []
    for _, type_string in args:
        if type_string.startswith('NDArray-or-Symbol'):
            inputs += [LP(2, 3)] * (2 if type_string.endswith('[]') else 1)
    attrs = {key_var: len(inputs)} if key_var and any(t.endswith('[]') for _, t in args) else {}
    return inputs, attrs


def _to_target(x, target):
    x = mx.nd.array(x, dtype='float32')
    return x.astype('float16') if target == 'float16' else mx.nd.amp_cast(x, dtype=bfloat16)


def _run_in(target, op):
    rng = np.random.RandomState(0)
    spec = RUN_SPECS.get(op) or _auto_spec(op)
    inputs, attrs = spec[target] if isinstance(spec, dict) else spec
    module = MODULES[target]
    for rule_op, attr, values in module.CONDITIONAL_FLOAT32:
        assert not (rule_op == op and attrs.get(attr) in values), 'spec runs a FLOAT32 case'
    # the spec keeps exactly the listed index and float32 inputs out of the target dtype
    for kind, table in (('index', module.INDEX_INPUTS), ('float32', module.FLOAT32_INPUTS)):
        listed = {p for p in table.get(op, ()) if p < len(inputs)}
        assert {p for p, spec in enumerate(inputs) if spec[0] == kind} == listed, (op, kind)
    args = []
    for spec in inputs:
        if spec[0] == 'float':
            args.append(_to_target(rng.uniform(0.5, 1.0, size=spec[1]), target))
        elif spec[0] == 'float32':
            args.append(mx.nd.array(rng.uniform(0.5, 1.0, size=spec[1])))
        elif spec[0] == 'index':
            args.append(mx.nd.array(spec[1], dtype=spec[2]))
        else:
            args.append(_to_target(spec[1], target))
    attrs = dict(attrs)
    if attrs.get('dtype') == 'target':
        attrs['dtype'] = bfloat16 if target == 'bfloat16' else target
    if attrs.get('out') == 'zeros':
        attrs['out'] = _to_target(np.zeros(args[0].shape), target)
    elif 'out' in attrs:
        attrs['out'] = args[attrs['out']]
    out = _function(mx.nd, op)(*args, **attrs)
    outputs = out if isinstance(out, (list, tuple)) else [out]
    mx.nd.waitall()
    return outputs


def _is_float(dtype):
    return dtype == bfloat16 or np.issubdtype(np.dtype(dtype), np.floating)


def _follow_and_widest(target):
    module = MODULES[target]
    return sorted({_op_info(name)[0] for name in module.FOLLOW + module.WIDEST_TYPE})


@pytest.mark.parametrize('target', TARGETS)
def test_follow_and_widest_ops_keep_the_target_dtype_on_cpu(target):
    wrong, failed = {}, {}
    assert set(NOT_RUN) <= set(_follow_and_widest('float16'))  # bfloat16: float32 (untested)
    for op in _follow_and_widest(target):
        if op in NOT_RUN:
            continue
        try:
            outputs = _run_in(target, op)
        except mx.MXNetError as err:
            if target == 'bfloat16' and op in ONEDNN_BF16 and ONEDNN_UNAVAILABLE in str(err):
                continue
            failed[op] = str(err).strip().splitlines()[-1][:160]
            continue
        dtypes = [o.dtype for o in outputs]
        expected = bfloat16 if target == 'bfloat16' else np.float16
        if not all(d == expected for d in dtypes if _is_float(d)):
            wrong[op] = dtypes
    assert not failed, '%s FOLLOW/WIDEST_TYPE ops without a %s kernel: %s' % (
        len(failed), target, failed)
    assert not wrong, 'ops whose float outputs are not %s: %s' % (target, wrong)


@pytest.mark.parametrize('target', TARGETS)
def test_ops_with_several_float_inputs_that_must_match_are_widest_type(target):
    # MXNet rejects mixed float16/float32 inputs for these, so FOLLOW would not be enough.
    module = MODULES[target]
    for op in ('elemwise_add', 'broadcast_add', '_maximum', 'Concat', 'stack', 'add_n',
               'where', 'LeakyReLU', '_slice_assign'):
        assert op in module.WIDEST_TYPE, op
    lhs, rhs = mx.sym.var('lhs'), mx.sym.var('rhs')
    with pytest.raises(mx.MXNetError):
        _infer_type(mx.sym.elemwise_add(lhs, rhs), lhs='float16', rhs='float32')
