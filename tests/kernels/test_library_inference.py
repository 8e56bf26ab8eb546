"""mxmp's operator library where MXNet asks it about types and shapes, reports errors, and runs
on several threads (tests/kernels/library_worker.py, each probe in a worker process).

- softmax with lengths on 1-D data takes lengths of shape (1,), as MXNet's softmax;
- partial type inference answers as MXNet's LayerNorm does (unknown stays unknown), and shape
  inference with deferred gamma/beta (Gluon's (0,)) works for 1-D to 3-D data;
- a shape with an unknown dimension gives an error naming it (MXNet's wrapper cannot carry an
  unknown dimension back: before, it came back as 2**32 - 1 and crashed);
- errors name dtypes ("got float16"), attributes are parsed without the C library's locale and
  a bad one is an error, not an exception thrown across the C interface;
- every output's bits are the same at 1 and 2 threads (rows are independent; dgamma/dbeta add
  fixed blocks of rows in a fixed order), and the library runs on libgomp, MXNet's runtime.
"""
import os
import subprocess

import pytest

from mxmp._src.kernels.build import load_library

from test_contract import worker
from tier_run import needs_library



@pytest.fixture(scope='module')
def inference():
    return worker('inference')


@needs_library
def test_softmax_with_lengths_on_1d_data_as_mxnet(inference):
    assert inference['sm_1d_nd']['ok'] == inference['sm_1d_mxnet']
    for key in ('sm_shape_1d', 'sm_partial_1d', 'sm_partial_3d'):
        assert inference[key + '_lib'] == inference[key + '_mxnet'], key
    assert inference['sm_shape_1d_lib']['ok'][0] == [[5], [1]]
    assert 'length has shape (4,), it must be (5,)' in inference['sm_wrong_length']['error']


@needs_library
def test_layer_norm_partial_inference_as_mxnet(inference):
    for key in ('ln_type_none', 'ln_type_gamma', 'ln_type_data', 'ln_deferred_1d',
                'ln_deferred_3d'):
        assert 'ok' in inference[key + '_lib'], inference[key + '_lib']
        assert inference[key + '_lib'] == inference[key + '_mxnet'], key
    assert inference['ln_type_none_lib']['ok'][0] == [None, None, None]
    assert inference['dropout_type_partial']['ok'] == [[None, 'float32'], [None, 'int32'], []]
    assert "data's shape (2, ?) has an unknown dimension" in inference['ln_unknown_dim']['error']
    assert 'gamma has shape (4,), it must be (3,)' in inference['ln_wrong_gamma']['error']
    # a converted Gluon LayerNorm on 1-D data, gamma and beta deferred: the library op runs
    assert 'mxmp_layer_norm' in inference['gluon_1d_ops']
    for got, want in zip(inference['gluon_1d'], inference['gluon_1d_mxnet']):
        assert abs(got - want) <= 1e-6


@needs_library
def test_errors_name_dtypes_and_bad_attributes(inference):
    res = inference['messages']
    assert res['ln_float16']['error'].endswith(
        'mxmp_layer_norm: data, gamma and beta must be float32, float64 or bfloat16, got '
        'float16')
    assert res['dropout_int32']['error'].endswith(
        'mxmp_dropout: data must be float32, float64 or bfloat16, got int32')
    assert res['softmax_float16']['error'].endswith('got float16')
    assert "attribute p='abc' is not a number" in res['dropout_bad_p']['error']
    assert "attribute eps='1e-5x' is not a number" in res['ln_bad_eps']['error']
    assert 'p must be in (0, 1), got 1' in res['dropout_p_one']['error']
    assert not any('enum' in v.get('error', '') for v in res.values())


@needs_library
def test_same_bits_at_one_and_two_threads_on_libgomp():
    assert worker('outputs', threads=1) == worker('outputs', threads=2)
    ldd = subprocess.run(['ldd', load_library()], capture_output=True, text=True).stdout
    assert 'libgomp' in ldd
