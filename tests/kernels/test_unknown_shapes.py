"""Converted graphs whose library ops have inputs of unknown or partly known shape
(tests/kernels/shape_worker.py, in worker processes: the old graphs crashed MXNet).

MXNet 1.9.1's wrapper of library ops sizes its buffer of input shapes as the sum of the inputs'
numbers of axes, an unknown shape counting -1, and then writes every known axis into it. Any
input of unknown shape beside one with axes therefore wrote past the buffer or through a null
pointer: a LayerNorm whose gamma and beta are Symbol variables without shape, ``mxmp_dropout``
without data's shape (its flag is (1,)), softmax with 1-D data and lengths of unknown shape or
the reverse. The kernel rule now passes every input but data as MXNet's "extra inputs", which
the wrapper leaves out, and MXNet's own ops shape them from data (docs/pass.md, "Kernel rule").
With data's shape wholly known, every shape is the float32 graph's; without it, a converted
graph raises an MXNetError where MXNet's op answers "unknown" (the wrapper cannot leave a shape
unknown), and nothing crashes.
"""
import json
import os
import subprocess
import sys

import pytest

from tier_run import needs_library

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope='module', params=['native', 'AVX2'])
def results(request):
    env = {'DNNL_MAX_CPU_ISA': 'AVX2'} if request.param == 'AVX2' else {}
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'shape_worker.py')],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS='1', **env))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_library
def test_partial_inference_with_shapeless_gamma_beta_as_mxnet(results):
    res = results['partial']
    for ndim in (1, 2, 3, 4):
        assert 'mxmp_layer_norm' in res['ln_ops_%d' % ndim]
        assert 'mxmp_softmax' in res['sm_ops_%d' % ndim]
        # the float32 graph comes back exactly
        assert res['ln_removed_%d' % ndim]
        assert res['ln_written_%d' % ndim] == [['__dtype__', '__mxmp__']] * 2, res
        for known in ('x', 'xg', 'xb', 'xgb'):
            got, want = res['ln_%d_%s' % (ndim, known)]
            assert 'args' in want and got == want, (ndim, known, got, want)
        got, want = res['sm_%d' % ndim]
        assert 'args' in want and got == want, (ndim, got, want)
        # data unknown: an error, no crash (was a write past MXNet's shape buffer)
        err = res['ln_%d_nodata' % ndim]['error']
        assert 'MXNetError' in err and '_mxmp_last_axis' in err, err


@needs_library
def test_module_binds_layer_norm_with_shapeless_gamma_beta(results):
    res = results['module']
    assert sorted(res) == ['2', '3', '4']
    for ndim, row in res.items():
        assert 'mxmp_layer_norm' in row['ops'], row
        # output and gamma/beta gradients against MXNet's float32 LayerNorm (the library op
        # computes in float32: measured below 2e-7 relative, seed 0)
        assert max(row['err']) <= 2e-6, (ndim, row)


WHOLE = ('1d', '2d', '3d', '4d')


@needs_library
def test_partly_known_shapes_never_crash_and_match_float32(results):
    grid = results['grid']
    ops = {'ln': 'mxmp_layer_norm', 'do': 'mxmp_dropout', 'sm': 'mxmp_softmax'}
    cases = [k for k in grid if not k.endswith('_ops') and k != 'sm_types']
    # the lengths' dtype unknown: partial types as MXNet's softmax gives them
    assert grid['sm_types'][0] == grid['sm_types'][1] == [['float32', None], ['float32']]
    # 3 ops x 2 sources x 6 data shapes, with and without the side input (not for Dropout)
    assert len(cases) == 2 * (6 * 2 + 6 + 6 * 2), len(cases)
    for graph in ('ln_var', 'ln_op', 'do_var', 'do_op', 'sm_var', 'sm_op'):
        assert ops[graph[:2]] in grid[graph + '_ops'], graph
    for key in cases:
        data = key.split('|')[1]
        for kind in ('partial', 'full'):
            got, want = grid[key][kind]
            if data in WHOLE:
                # data's shape whole: every shape known (and every error) as in float32
                assert got == want, (key, kind, got, want)
                assert 'error' not in got, (key, kind, got)
            else:
                # data's shape unknown or with an unknown dimension: an error (MXNet's wrapper
                # cannot leave a shape unknown) where MXNet's op may answer "unknown"
                assert 'MXNetError' in got.get('error', ''), (key, kind, got)
    # the 1-D softmax that crashed (lengths' shape unknown): MXNet's (1,)
    assert grid['sm_var|1d|0']['partial'][0]['args'] == [
        ['fc_bias', [3]], ['fc_weight', [3, 1]], ['l', [1]], ['x', [5]]]


@needs_library
def test_module_binds_every_library_op_with_inferred_side_shapes(results):
    res = results['bind']
    assert len(res) == 16, sorted(res)
    for key, (mxmp_run, mxnet_run) in res.items():
        assert 'out' in mxnet_run, (key, mxnet_run)
        assert mxmp_run == mxnet_run, (key, mxmp_run, mxnet_run)
