"""bfloat16 through mxmp's operator library (mxmp/_src/kernels/mxmp_ops.cc, the kernel rule in
mxmp/_src/graph/kernel_rule.py): LayerNorm, softmax with lengths and Dropout take and return
bfloat16, so that a converted bfloat16 graph has no cast around them.

Pinned: each op's actual outputs and gradients are bfloat16 (LayerNorm's mean, rstd and the
gradients of float32 gamma/beta float32, bfloat16 gamma/beta give bfloat16 gradients), exactly
the library's float32 op on the same bfloat16 values rounded to bfloat16 once (forward and
backward; Dropout with the same seed); a converted transformer-like block (Dense -> LayerNorm ->
Dense -> Dropout -> softmax with lengths -> Dense) holds exactly the casts of its Dense layers
and its output, 8 instead of 12 with MXNet's float32 ops (``Policy(kernels='mxnet')``, and
before this change); explain names the library op and its dtype; a user's ``fp32_ops`` keeps it
float32; the converted block's output and gradients are within bfloat16's error of float32's
(real kernels, or emulated where the CPU has none).

Tolerances: measured over seeds 0-4 (Zen 4, real kernels and ``DNNL_MAX_CPU_ISA=AVX2``
emulation): the block's output 2.4e-3 to 3.7e-3 of its largest magnitude (both), fc1's weight
gradient 4.4e-3 to 7.6e-3 (real), 1.7e-3 to 3.6e-3 (emulated); bounds 2e-2 and 4e-2.
"""
import json

import numpy as np
import pytest

import mxnet as mx
from mxnet import autograd
from mxnet.contrib.amp.amp import bfloat16

import mxmp
from mxmp._src.graph.kernel_rule import LOW_SUFFIX
from mxmp._src.graph.strip import without_library_ops
from mxmp._src.graph.symbol_json import MARK
from mxmp._src.kernels.build import OPS, load_library
from tier_run import needs_library

LIBRARY = load_library() is not None
REAL = mxmp.lp_kernels_available('bfloat16')
SHAPE = (2, 6, 32)
NAMES = ('data', 'length')


def _bf(a):
    return mx.nd.amp_cast(mx.nd.array(a), dtype=bfloat16)


def _f32(a):
    return (a if a.dtype == np.float32 else mx.nd.amp_cast(a, dtype='float32')).asnumpy()


def _run(fn, arrays, grads, head, seed=3):
    for a in grads:
        a.attach_grad()
    mx.random.seed(seed)
    with autograd.record():
        out = fn(*arrays)
    y = out[0] if isinstance(out, (list, tuple)) else out
    y.backward(head)
    return out, [a.grad for a in grads]


@needs_library
@pytest.mark.parametrize('shape', [(48, 64), (300, 333)])
@pytest.mark.parametrize('op', ['layer_norm', 'layer_norm_bf16_params', 'softmax', 'dropout'])
def test_ops_take_and_return_bfloat16_as_the_float32_op_rounded_once(op, shape):
    # (300, 333): the parallel loops (100k elements), rows that are not whole vectors, Dropout's
    # two blocks of hash counters and partial slices of the bfloat16 forward
    rows, d = shape
    rng = np.random.RandomState(0)
    x = rng.normal(size=shape).astype(np.float32) * 3 + 1
    x[5, 7], x[6, 0] = np.inf, np.nan
    x[9, :] = -np.inf   # a row of -inf
    x[10, :] = 3e38     # a row of large values
    head = rng.normal(size=x.shape).astype(np.float32)
    head[11, d // 2:] = np.nan   # NaN gradients beyond a row's length (softmax) are not read
    xb, hb = _bf(x), _bf(head)
    x32, h32 = mx.nd.array(_f32(xb)), mx.nd.array(_f32(hb))   # the same values in float32
    g, b = rng.uniform(0.5, 2, d).astype(np.float32), rng.normal(size=d).astype(np.float32)
    if op.startswith('layer_norm'):
        params = [_bf(g), _bf(b)] if op.endswith('bf16_params') else [mx.nd.array(g),
                                                                       mx.nd.array(b)]
        fn = lambda x, g, b: mx.nd.mxmp_layer_norm(x, g, b)   # noqa: E731
        out, grads = _run(fn, [xb] + params, [xb] + params, hb)
        p32 = [mx.nd.array(_f32(p)) if p.dtype == bfloat16 else p.copy() for p in params]
        ref, ref_grads = _run(fn, [x32] + p32, [x32] + p32, h32)
        assert [o.dtype for o in out] == [bfloat16, np.float32, np.float32]
        assert [d.dtype for d in grads] == [bfloat16] + [params[0].dtype] * 2
        outs = [(out[0], ref[0])] + list(zip(grads, ref_grads))
        np.testing.assert_array_equal(out[1].asnumpy(), ref[1].asnumpy())   # mean
    else:
        if op == 'softmax':
            lengths = rng.randint(0, d + 6, size=rows)
            lengths[:4] = 0, 1, 17, d   # none, one, a vector and one, the whole row
            lengths[11] = d // 2
            length = mx.nd.array(lengths, dtype='int32')
            fn = lambda x: mx.nd.mxmp_softmax(x, length, use_length=True)   # noqa: E731
        else:
            flag = mx.nd.zeros((1,))
            fn = lambda x: mx.nd.mxmp_dropout(x, flag, p=0.3, mode='always')   # noqa: E731
        out, grads = _run(fn, [xb], [xb], hb)
        ref, ref_grads = _run(fn, [x32], [x32], h32)
        if op == 'dropout':
            assert out[1].dtype == np.int32 and out[1].shape == (2,)   # the same seeds
            np.testing.assert_array_equal(out[1].asnumpy(), ref[1].asnumpy())
            out, ref = out[0], ref[0]
        assert out.dtype == bfloat16 and grads[0].dtype == bfloat16
        outs = [(out, ref), (grads[0], ref_grads[0])]
    for got, want in outs:
        if got.dtype == bfloat16:   # the float32 result rounded once (MXNet's cast: RNE)
            want = mx.nd.amp_cast(want, dtype=bfloat16)
        # equal values (exact: bfloat16 widens exactly; NaN where NaN). Not bits: MXNet's cast
        # gives +0 for a float32 -0 under DNNL_MAX_CPU_ISA=AVX2 (a dropped negative x * 0)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(_f32(got), _f32(want))


def _block(dropout=True):
    """Dense -> LayerNorm -> Dense -> Dropout -> softmax with lengths -> Dense."""
    data, length = mx.sym.var('data'), mx.sym.var('length', dtype='int32')
    h = mx.sym.FullyConnected(data, num_hidden=32, flatten=False, name='fc1')
    h = mx.sym.LayerNorm(h, name='ln')
    h = mx.sym.FullyConnected(h, num_hidden=32, flatten=False, name='fc2')
    if dropout:
        h = mx.sym.Dropout(h, p=0.1, name='drop')
    h = mx.sym.reshape(h, shape=(0, 0, 4, 8), name='heads')
    h = mx.sym.softmax(h, length=length, axis=-1, use_length=True, name='sm')
    h = mx.sym.reshape(h, shape=(0, 0, -1), name='merged')   # named: not a global counter's
    return mx.sym.FullyConnected(h, num_hidden=8, flatten=False, name='fc3')


def _convert(sym, **kw):
    return mxmp.convert_symbol(sym, policy=mxmp.Policy('bfloat16', **kw), data_names=NAMES,
                               data_dtypes={'length': 'int32'})


def _casts(sym):
    nodes = json.loads(sym.tojson(remove_amp_cast=False))['nodes']
    return sorted((n['attrs']['dtype'], nodes[n['inputs'][0][0]]['name']) for n in nodes
                  if n['op'] == 'amp_cast')


@needs_library
def test_a_converted_block_has_no_cast_around_the_library_ops():
    sym = _block()
    params = [('bfloat16', 'fc%d_%s' % (i, p)) for i in (1, 2, 3) for p in ('bias', 'weight')]
    got = _casts(_convert(sym))
    # 9: the last is the (D,) arange that shapes gamma and beta (MXNet's identity copy wants
    # one dtype for both its inputs), not data
    assert got == sorted([('bfloat16', 'data'), ('float32', 'fc3'),
                          ('float32', 'ln_mxmp_last_axis')] + params)
    # MXNet's float32 ops (and the library in float32 before bfloat16 kernels): 4 more casts
    mxnet = _casts(_convert(sym, kernels='mxnet'))
    assert len(mxnet) == 12 and set(mxnet) - set(got) - {('float32', 'ln_mxmp_last_axis')} == {
        ('float32', 'fc1'), ('bfloat16', 'ln'), ('float32', 'fc2'), ('bfloat16', 'merged')}
    # MXNet types the library ops bfloat16 in the converted graph
    conv = _convert(sym)
    internals = conv.get_internals()
    _, types, _ = internals.infer_type(data=np.float32, length=np.int32)
    dtypes = dict(zip(internals.list_outputs(), types))
    for name in ('ln_output0', 'drop_output0', 'sm_output'):
        assert dtypes[name] == bfloat16, (name, dtypes[name])
    assert dtypes['ln_output1'] == dtypes['ln_output2'] == np.float32   # mean, rstd
    assert dtypes['drop_output1'] == np.int32   # the seeds
    # emulated, the library ops compute float32-held values: no bfloat16 mark for mxnet_ops
    marks = [n['attrs'][MARK] for n in json.loads(_convert(sym, emulate=True).tojson(
        remove_amp_cast=False))['nodes'] if n['op'].startswith('mxmp_')]
    assert len(marks) == 3 and not any(LOW_SUFFIX in m for m in marks)
    rows = {r.name: r for r in mxmp.explain(sym, 'bfloat16', data_names=NAMES,
                                            data_dtypes={'length': 'int32'})}
    for name, op in (('ln', 'mxmp_layer_norm'), ('drop', 'mxmp_dropout'),
                     ('sm', 'mxmp_softmax')):
        assert rows[name].op == op and rows[name].dtype == 'bfloat16', rows[name]
        assert 'kernel rule' in rows[name].rule and "data's dtype" in rows[name].rule


@needs_library
def test_user_lists_keep_their_choice():
    sym = _block()
    # fp32_ops: the library op computes in float32, casts around it
    conv = _convert(sym, fp32_ops=['LayerNorm'])
    assert ('float32', 'fc1') in _casts(conv) and ('bfloat16', 'ln') in _casts(conv)
    rows = {r.name: r for r in mxmp.explain(sym, policy=mxmp.Policy('bfloat16',
                                                                    fp32_ops=['LayerNorm']),
                                            data_names=NAMES, data_dtypes={'length': 'int32'})}
    assert rows['ln'].dtype == 'float32' and rows['ln'].op == 'mxmp_layer_norm'
    assert 'fp32_ops (user override)' in rows['ln'].rule
    # lp_ops: MXNet's own op in the user's class
    ops = {n['op'] for n in json.loads(_convert(sym, lp_ops=['Dropout']).tojson(
        remove_amp_cast=False))['nodes']}
    assert 'Dropout' in ops and 'mxmp_dropout' not in ops and 'mxmp_layer_norm' in ops


def _bind(sym, seed, shapes, grad_req='null'):
    rng = np.random.RandomState(seed)
    exe = sym.simple_bind(mx.cpu(), data=shapes['data'], length=shapes['length'],
                         type_dict={'data': np.float32, 'length': np.int32},
                         grad_req=grad_req)
    for name, arr in exe.arg_dict.items():
        if name == 'length':
            arr[:] = rng.randint(0, 9, size=arr.shape)
        elif name == 'data':
            arr[:] = rng.normal(size=arr.shape)
        else:
            arr[:] = rng.normal(size=arr.shape) * (0.2 if 'weight' in name else 0.1)
    return exe


@needs_library
@pytest.mark.parametrize('seed', [0, 1])
def test_converted_block_is_within_bfloat16_error_of_float32(seed):
    shapes = {'data': SHAPE, 'length': SHAPE[:2] + (4,)}
    sym = _block(dropout=False)
    conv = _convert(sym, emulate=not REAL)
    req = {n: 'write' for n in sym.list_arguments() if n != 'length'}
    req['length'] = 'null'
    ref = _bind(sym, seed, shapes, req)
    exe = _bind(conv, seed, shapes, req)
    head = mx.nd.array(np.random.RandomState(seed + 10).normal(size=SHAPE[:2] + (8,)))
    want = ref.forward(is_train=True)[0].asnumpy()
    ref.backward(head)
    got = exe.forward(is_train=True)[0].asnumpy()
    exe.backward(head)
    assert got.dtype == np.float32 and not np.array_equal(got, want)
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
    gw, ww = exe.grad_dict['fc1_weight'].asnumpy(), ref.grad_dict['fc1_weight'].asnumpy()
    assert np.abs(gw - ww).max() <= 4e-2 * np.abs(ww).max()
    # with Dropout, in inference (identity): the same
    sym, conv = _block(), _convert(_block(), emulate=not REAL)
    want = _bind(sym, seed, shapes).forward(is_train=False)[0].asnumpy()
    got = _bind(conv, seed, shapes).forward(is_train=False)[0].asnumpy()
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


@needs_library
def test_mxnet_ops_puts_the_casts_back_around_bfloat16_library_ops():
    # what every file mxmp writes holds: MXNet's ops, which have no bfloat16 CPU kernel for
    # these three, in float32 between a cast to float32 and one back to bfloat16
    sym = _block()
    conv = _convert(sym)
    plain = without_library_ops(conv)
    nodes = json.loads(plain.tojson(remove_amp_cast=False))['nodes']
    assert not {n['op'] for n in nodes} & set(OPS)
    for op in ('LayerNorm', 'Dropout', 'softmax'):
        node = [n for n in nodes if n['op'] == op and n['name'] != 'mxmp_train_flag'][0]
        before = nodes[node['inputs'][0][0]]
        after = [n for n in nodes if n['op'] == 'amp_cast' and
                 nodes[n['inputs'][0][0]] is node]
        assert before['op'] == 'amp_cast' and before['attrs']['dtype'] == 'float32', op
        assert len(after) == 1 and after[0]['attrs']['dtype'] == 'bfloat16', op
    assert len(_casts(plain)) == 8 + 6
    assert mxmp.remove_casts(plain).tojson() == sym.tojson()
    if REAL:   # plain MXNet runs it: the same outputs (inference)
        shapes = {'data': SHAPE, 'length': SHAPE[:2] + (4,)}
        want = _bind(conv, 0, shapes).forward(is_train=False)[0].asnumpy()
        got = _bind(plain, 0, shapes).forward(is_train=False)[0].asnumpy()
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()
