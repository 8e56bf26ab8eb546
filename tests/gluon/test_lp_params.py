"""Parameters that arrive in low precision (``net.cast('bfloat16')``, contrib.amp's
``cast_optional_params``: a ``__dtype__`` on the variable; or declared by
``convert_symbol(..., data_dtypes=...)``) at a float32 op never crash.

MXNet 1.9.1 needs some inputs as graph variables: a float32 Deconvolution whose weight is the
output of a cast crashes in training, and BatchNorm's moving statistics behind a cast stop
being auxiliary states. The pass stores such a parameter in float32 (exact: a float32 array
holds every bfloat16/float16 value), marked so that ``remove_casts`` restores its ``__dtype__``.
Runs that could crash the interpreter run in a subprocess.
"""
import json
import os
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest

import mxmp
from mxmp._src.conformance.check import check_kernels
from mxmp._src.dtypes import MSHADOW_ENUM
from mxmp._src.graph.strip import arrays_for_graph
from mxmp._src.graph.symbol_json import MARK

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def nodes_of(sym):
    return json.loads(sym.tojson(remove_amp_cast=False))['nodes']


def float32_param_names(sym):
    """The variables declared in low precision that the converted graph stores in float32."""
    return {n['name'] for n in nodes_of(sym)
            if n['op'] == 'null' and n.get('attrs', {}).get(MARK, '').startswith('float32_param')}


def deconv_graph(lp, bias=True):
    """conv, relu, Deconvolution whose weight (and bias) are declared ``lp`` by ``__dtype__``
    (``lp`` None: undeclared, for ``data_dtypes``)."""
    conv = mx.sym.Convolution(mx.sym.var('data'), num_filter=8, kernel=(3, 3), pad=(1, 1),
                              name='conv')
    kw = {'__dtype__': MSHADOW_ENUM[lp]} if lp else {}
    w = mx.sym.var('deconv_weight', **kw)
    extra = [mx.sym.var('deconv_bias', **kw)] if bias else []
    return mx.sym.Deconvolution(mx.sym.relu(conv, name='relu'), w, *extra, num_filter=4,
                                kernel=(4, 4), stride=(2, 2), pad=(1, 1), no_bias=not bias,
                                name='deconv')


@pytest.mark.parametrize('lp,emulate', [('bfloat16', False), ('bfloat16', True),
                                        ('float16', True)])
def test_a_low_precision_deconvolution_weight_is_stored_float32_not_cast(lp, emulate):
    sym = deconv_graph(lp)
    out = mxmp.convert_symbol(sym, lp, emulate=emulate)
    nodes = nodes_of(out)
    by_name = {n['name']: n for n in nodes}
    deconv = by_name['deconv']
    # The weight and bias are the variables themselves, in float32, no cast in between.
    assert [nodes[i[0]]['name'] for i in deconv['inputs']][1:] == ['deconv_weight',
                                                                   'deconv_bias']
    for name in ('deconv_weight', 'deconv_bias'):
        assert by_name[name]['attrs'] == {'__dtype__': '0',
                                          MARK: 'float32_param:' + MSHADOW_ENUM[lp]}
        assert not [n for n in nodes if n['op'] == 'amp_cast' and
                    nodes[n['inputs'][0][0]]['name'] == name]
    assert float32_param_names(out) == {'deconv_weight', 'deconv_bias'}
    policy = mxmp.Policy(lp, emulate=emulate)
    rule = {r.name: r.rule for r in mxmp.explain(sym, policy=policy)}
    assert rule['deconv_weight'] == (
        'parameter stored in float32 (its __dtype__ says %s, but Deconvolution deconv takes it '
        'in float32 at input 1, which MXNet needs as a graph variable)' % lp)
    # remove_casts gives the declared graph back; converting again changes nothing.
    assert nodes_of(mxmp.remove_casts(out)) == nodes_of(sym)
    again = mxmp.convert_symbol(out, lp, emulate=emulate)
    assert again.tojson(remove_amp_cast=False) == out.tojson(remove_amp_cast=False)


def test_float16_deconvolution_on_real_kernels_keeps_its_float16_weight():
    """Real float16 (GPU) runs Deconvolution in float16: the weight is taken as stored."""
    out = mxmp.convert_symbol(deconv_graph('float16'), 'float16')
    by_name = {n['name']: n for n in nodes_of(out)}
    assert by_name['deconv_weight']['attrs'] == {'__dtype__': '2'}
    assert float32_param_names(out) == frozenset()


def test_batchnorm_statistics_in_low_precision_stay_auxiliary_states():
    lp = MSHADOW_ENUM['bfloat16']
    data = mx.sym.var('data')
    params = {n: mx.sym.var('bn_' + n, __dtype__=lp)
              for n in ('gamma', 'beta', 'moving_mean', 'moving_var')}
    sym = mx.sym.BatchNorm(data, params['gamma'], params['beta'], params['moving_mean'],
                           params['moving_var'], fix_gamma=False, name='bn')
    out = mxmp.convert_symbol(sym, 'bfloat16', data_dtypes={'data': 'bfloat16'})
    assert out.list_auxiliary_states() == ['bn_moving_mean', 'bn_moving_var']
    assert float32_param_names(out) == {'bn_moving_mean', 'bn_moving_var'}
    nodes = nodes_of(out)
    bn = next(n for n in nodes if n['op'] == 'BatchNorm')
    # gamma and beta may be computed: they get the usual cast to float32
    assert [nodes[i[0]]['name'] for i in bn['inputs']] == [
        'data', 'bn_gamma_amp_cast_float32', 'bn_beta_amp_cast_float32', 'bn_moving_mean',
        'bn_moving_var']


_TRAIN = textwrap.dedent('''
    import sys, json
    import numpy as np, mxnet as mx, mxmp
    from mxmp._src.dtypes import MSHADOW_ENUM, mx_dtype
    from mxmp._src.graph.strip import arrays_for_graph
    sys.path.insert(0, sys.argv[1])
    from tests.gluon.test_lp_params import deconv_graph
    lp, emulate = 'bfloat16', not mxmp.lp_kernels_available('bfloat16')
    sym = deconv_graph(lp)
    out = mxmp.convert_symbol(sym, lp, emulate=emulate)
    rng = np.random.RandomState(0)
    shapes = dict(zip(sym.list_arguments(), sym.infer_shape(data=(2, 3, 8, 8))[0]))
    values = {n: mx.nd.array(rng.uniform(-0.5, 0.5, s)) for n, s in shapes.items()}
    # the user's arrays: the parameters in bfloat16, as after net.cast('bfloat16')
    user = {n: (v if n == 'data' else mx.nd.amp_cast(v, dtype=mx_dtype(lp)))
            for n, v in values.items()}
    args = arrays_for_graph(out, user)
    grads = {n: a.zeros_like() for n, a in args.items()}
    exe = out.bind(mx.cpu(), args=args, args_grad=grads)
    exe.forward(is_train=True)
    exe.backward([mx.nd.ones(exe.outputs[0].shape)])
    mx.nd.waitall()
    ref_args = {n: mx.nd.amp_cast(a, dtype='float32') for n, a in user.items()}
    ref = sym.bind(mx.cpu(), args=ref_args, args_grad={n: a.zeros_like() for n, a in ref_args.items()})
    ref.forward(is_train=True)
    ref.backward([mx.nd.ones(ref.outputs[0].shape)])
    got, want = exe.outputs[0].asnumpy(), ref.outputs[0].asnumpy()
    gw, rw = exe.grad_dict['deconv_weight'].asnumpy(), ref.grad_dict['deconv_weight'].asnumpy()
    print(json.dumps({'dtype': np.dtype(args['deconv_weight'].dtype).name,
                      'fwd': float(abs(got - want).max() / abs(want).max()),
                      'bwd': float(abs(gw - rw).max() / abs(rw).max())}))
''')


def test_training_a_deconvolution_with_a_bfloat16_weight_does_not_crash():
    """Before: MXNet aborted (SIGSEGV / 'could not execute a primitive') in backward."""
    env = dict(os.environ, OMP_NUM_THREADS='1', MXNET_SUBGRAPH_BACKEND='NONE')
    proc = subprocess.run([sys.executable, '-c', _TRAIN, ROOT], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result['dtype'] == 'float32'
    # bfloat16 convolution in front: errors of bfloat16 size (eps 2**-7)
    assert result['fwd'] <= 2 ** -6 and result['bwd'] <= 2 ** -5, result


def test_conformance_runs_ops_with_low_precision_parameters():
    report = check_kernels('bfloat16', ops=['Deconvolution', 'BatchNorm'],
                                       seeds=(0,), jobs=1, cases=['lp-params'])
    rows = [(r['op'], r['variant'], r['case'], r['class'], r['verdict']) for r in report.rows]
    assert rows == [
        ('Deconvolution', '2x2 stride 2', 'lp-params', 'float32', 'ok'),
        ('Deconvolution', '4x4 stride 2 bias', 'lp-params', 'float32', 'ok'),
        ('BatchNorm', '', 'lp-params', 'follow', 'ok')], report.table()
    # an op the lists keep in float32, run only with low-precision parameters, is no evidence
    # for running it in low precision
    lp, fp32 = report.policy_changes(frozenset({'Deconvolution'}))
    assert lp == frozenset() and fp32 == frozenset()


def test_cases_argument_is_checked():
    with pytest.raises(ValueError, match='lp-params'):
        check_kernels('bfloat16', ops=['relu'], cases=['lp-weights'])


def test_arrays_for_graph_gives_float32_for_a_re_stored_parameter():
    out = mxmp.convert_symbol(deconv_graph('bfloat16', bias=False), 'bfloat16')
    arrays = {'deconv_weight': mx.nd.amp_cast(mx.nd.ones((8, 4, 4, 4)),
                                              dtype=mxmp._src.dtypes.mx_dtype('bfloat16'))}
    assert np.dtype(arrays_for_graph(out, arrays)['deconv_weight'].dtype) == \
        np.float32


def test_a_deconvolution_weight_declared_low_by_data_dtypes_is_declared_float32():
    """convert_symbol(sym, 'bfloat16', data_dtypes={weight: 'bfloat16'}): the weight reaching
    a float32 Deconvolution through a cast aborted MXNet in training; the graph declares it
    float32 instead, so binding puts a float32 array there."""
    sym = deconv_graph(None)
    low = {'deconv_weight': 'bfloat16', 'deconv_bias': 'bfloat16'}
    out = mxmp.convert_symbol(sym, 'bfloat16', data_dtypes=low)
    nodes = nodes_of(out)
    by_name = {n['name']: n for n in nodes}
    assert [nodes[i[0]]['name'] for i in by_name['deconv']['inputs']][1:] == [
        'deconv_weight', 'deconv_bias']
    for name in low:
        assert by_name[name]['attrs'] == {'__dtype__': '0', MARK: 'float32_param:'}
    rule = {r.name: r.rule for r in mxmp.explain(sym, 'bfloat16', data_dtypes=low)}
    assert rule['deconv_weight'] == (
        'declared float32 (data_dtypes says bfloat16, but Deconvolution deconv takes it in '
        'float32 at input 1, which MXNet needs as a graph variable: bind a float32 array '
        'there)')
    assert nodes_of(mxmp.remove_casts(out)) == nodes_of(sym)
    types = dict(zip(out.list_arguments(), out.infer_type(data='float32')[0]))
    assert types['deconv_weight'] == np.float32 and types['deconv_bias'] == np.float32


_TRAIN_DECLARED = textwrap.dedent('''
    import sys, json
    import numpy as np, mxnet as mx, mxmp
    from mxmp._src.dtypes import mx_dtype
    sys.path.insert(0, sys.argv[1])
    from tests.gluon.test_lp_params import deconv_graph
    sym = deconv_graph(None)
    low = {'deconv_weight': 'bfloat16', 'deconv_bias': 'bfloat16'}
    out = mxmp.convert_symbol(sym, 'bfloat16', data_dtypes=low,
                              emulate=not mxmp.lp_kernels_available('bfloat16'))
    exe = out.simple_bind(mx.cpu(), data=(2, 3, 8, 8))
    rng = np.random.RandomState(0)
    for name, arr in exe.arg_dict.items():
        arr[:] = rng.uniform(-0.5, 0.5, arr.shape)
    exe.forward(is_train=True)
    exe.backward([mx.nd.ones(exe.outputs[0].shape)])
    mx.nd.waitall()
    ref = sym.simple_bind(mx.cpu(), data=(2, 3, 8, 8))
    for name, arr in exe.arg_dict.items():
        ref.arg_dict[name][:] = arr
    ref.forward(is_train=True)
    ref.backward([mx.nd.ones(ref.outputs[0].shape)])
    got, want = exe.outputs[0].asnumpy(), ref.outputs[0].asnumpy()
    gw, rw = exe.grad_dict['deconv_weight'].asnumpy(), ref.grad_dict['deconv_weight'].asnumpy()
    # the user's own bfloat16 arrays there: MXNet's error, raised, not an abort
    args = {n: (mx.nd.amp_cast(a, dtype=mx_dtype('bfloat16')) if n in low else a)
            for n, a in exe.arg_dict.items()}
    try:
        out.bind(mx.cpu(), args=args, args_grad={n: a.zeros_like() for n, a in args.items()})
        refused = ''
    except mx.base.MXNetError as err:
        refused = str(err)
    print(json.dumps({'dtypes': sorted({np.dtype(exe.arg_dict[n].dtype).name for n in low}),
                      'fwd': float(abs(got - want).max() / abs(want).max()),
                      'bwd': float(abs(gw - rw).max() / abs(rw).max()), 'refused': refused}))
''')


def test_training_a_deconvolution_declared_low_by_data_dtypes_does_not_crash():
    env = dict(os.environ, OMP_NUM_THREADS='1')   # MXNet's default fusion, as a user runs it
    proc = subprocess.run([sys.executable, '-c', _TRAIN_DECLARED, ROOT], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result['dtypes'] == ['float32']
    # bfloat16 convolution in front: errors of bfloat16 size (eps 2**-7), as above
    assert result['fwd'] <= 2 ** -6 and result['bwd'] <= 2 ** -5, result
    assert 'requires uniform type' in result['refused'] and "'weight'" in result['refused']
