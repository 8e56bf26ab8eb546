"""The one-op graphs of the conformance suite (docs/conformance.md).

``CASES[op]``: a list of ``(variant, inputs, attrs)``: ``variant`` names the attribute choice
(``''`` when there is one), ``inputs`` the op's inputs in order as ``(shape, kind)``, ``attrs``
the keyword arguments of ``mx.sym.<op>``. Input kinds (seeded ``numpy.random.RandomState``):
``n`` normal(0, 1); ``p`` uniform(0.5, 2); ``c`` uniform(1.5, 3); ``m`` 0/1 mask; ``w`` normal
weight or bias and ``g`` uniform(0.5, 2) gamma (float32 inputs the pass casts); ``a``
auxiliary state (positive); ``iN`` integers in [0, N) as float32, ``IN`` as int32; ``lN``
sequence lengths in [1, N]; ``sN`` 2 x 128 distinct (row, column) indices into N x N.
:data:`PARAM_KINDS` arrive stored in the target dtype in the ``lp-params`` case.
``NOT_TESTED[op]``: why an op has no case.
"""

PARAM_KINDS = ('w', 'g', 'a')

NCHW = (4, 32, 16, 16)
BTF = (8, 32, 64)
_SMALL = ((8, 1, 64), 'n')


def _one(dims=BTF, kind="n", **attrs):
    return [("", [(dims, kind)], attrs)]


def _two(lhs='n', rhs='n', shapes=(BTF, BTF)):
    return [('', [(shapes[0], lhs), (shapes[1], rhs)], {})]


_X = (NCHW, 'n')
_T = (BTF, 'n')
_BCAST = (NCHW, (1, 32, 1, 1))
_CMP = ('_equal', '_greater', '_greater_equal', '_lesser', '_lesser_equal', '_not_equal')

CASES = {
    # -- gemm --------------------------------------------------------------------------------
    'Convolution': [
        ('dense 3x3', [_X, ((32, 32, 3, 3), 'w'), ((32,), 'w')],
         dict(kernel=(3, 3), pad=(1, 1), num_filter=32)),
        ('depthwise 3x3', [_X, ((32, 1, 3, 3), 'w'), ((32,), 'w')],
         dict(kernel=(3, 3), pad=(1, 1), num_filter=32, num_group=32)),
    ],
    'Deconvolution': [('2x2 stride 2', [_X, ((32, 16, 2, 2), 'w')],
                       dict(kernel=(2, 2), stride=(2, 2), num_filter=16, no_bias=True)),
                      ('4x4 stride 2 bias', [_X, ((32, 16, 4, 4), 'w'), ((16,), 'w')],
                       dict(kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=16,
                            no_bias=False))],
    'FullyConnected': [
        ('flatten=False', [_T, ((128, 64), 'w'), ((128,), 'w')],
         dict(num_hidden=128, flatten=False)),
        ('flatten=True', [_X, ((64, 8192), 'w'), ((64,), 'w')], dict(num_hidden=64)),
    ],
    # -- binary and join (WIDEST_TYPE) ------------------------------------------------------
    'elemwise_add': _two(), 'elemwise_sub': _two(), 'elemwise_mul': _two(),
    'elemwise_div': _two(rhs='p'), '_grad_add': _two(), '_maximum': _two(), '_minimum': _two(),
    '_mod': _two(rhs='p'), '_identity_with_attr_like_rhs': _two(),
    '_scatter_elemwise_div': _two(rhs='p'),
    '_logical_and': _two('m', 'm'), '_logical_or': _two('m', 'm'),
    '_logical_xor': _two('m', 'm'),
    'broadcast_add': _two(shapes=_BCAST), 'broadcast_sub': _two(shapes=_BCAST),
    'broadcast_mul': _two(shapes=_BCAST), 'broadcast_div': _two(rhs='p', shapes=_BCAST),
    'broadcast_mod': _two(rhs='p', shapes=_BCAST),
    'broadcast_maximum': _two(shapes=_BCAST), 'broadcast_minimum': _two(shapes=_BCAST),
    'broadcast_logical_and': _two('m', 'm', _BCAST), 'broadcast_logical_or': _two('m', 'm', _BCAST),
    'broadcast_logical_xor': _two('m', 'm', _BCAST),
    'Concat': [('dim=1', [_X, _X], dict(dim=1, num_args=2))],
    'stack': [('axis=1', [_T, _T], dict(axis=1, num_args=2))],
    'add_n': [('3 inputs', [_X, _X, _X], dict(num_args=3))],
    '_rnn_param_concat': [('dim=0', [((4096,), 'n'), ((1024,), 'n')], dict(dim=0, num_args=2))],
    'where': [('', [(BTF, 'm'), _T, _T], {})],
    'LeakyReLU': [('leaky', [_X], dict(act_type='leaky', slope=0.1)),
                  ('gelu', [_X], dict(act_type='gelu'))],
    '_contrib_index_copy': [('', [((64, 64), 'n'), ((16,), 'I64'), ((16, 64), 'n')], {})],
    '_slice_assign': [('', [_T, ((8, 16, 64), 'n')], dict(begin=(0, 8, 0), end=(8, 24, 64)))],
    # -- FOLLOW: activations, normalization, pooling ----------------------------------------
    'Activation': [(t, [_X], dict(act_type=t)) for t in ('relu', 'sigmoid', 'tanh')],
    # -- FLOAT32 ops with parameters: run by default in the lp-params case only -----------
    'LayerNorm': [('', [_T, ((64,), 'g'), ((64,), 'w')], {}),
                  # library: the output read by two ops, the kernel rule's copy (copy_out=1)
                  ('copy odd', [((3, 33, 67), 'n'), ((67,), 'g'), ((67,), 'w')], {})],
    # -- FLOAT32 ops mxmp's operator library replaces: the library case only ----------------
    'Dropout': [('p=0.1', [((8, 128, 256), 'n')], dict(p=0.1))],
    'softmax': [('use_length', [((24, 32, 32), 'n'), ((24, 32), 'I33')],
                 dict(axis=-1, use_length=True))],
    # the attention matmuls (bfloat16 products): head dim 16, and odd sizes (tile edges)
    '_contrib_interleaved_matmul_selfatt_qk': [
        ('heads=4', [((32, 4, 192), 'n')], dict(heads=4)),
        ('heads=3 odd', [((33, 2, 153), 'n')], dict(heads=3))],
    '_contrib_interleaved_matmul_selfatt_valatt': [
        ('heads=4', [((32, 4, 192), 'n'), ((16, 32, 32), 'p')], dict(heads=4)),
        # library: with a selfatt_qk on the same qkv, the kernel rule's pair (emit_v, v_only)
        ('pair heads=3 odd', [((33, 2, 153), 'n'), ((6, 33, 33), 'p')], dict(heads=3))],
    '_contrib_interleaved_matmul_encdec_qk': [
        ('heads=4', [((24, 4, 64), 'n'), ((33, 4, 128), 'n')], dict(heads=4))],
    '_contrib_interleaved_matmul_encdec_valatt': [
        ('heads=4', [((33, 4, 128), 'n'), ((16, 24, 33), 'p')], dict(heads=4))],
    # batch_dot (Policy(kernels='all')): every transpose combination, odd sizes
    'batch_dot': [('', [((6, 33, 20), 'n'), ((6, 20, 37), 'n')], {}),
                  ('transpose_b', [((6, 33, 20), 'n'), ((6, 37, 20), 'n')],
                   dict(transpose_b=True)),
                  ('transpose_a 4-D', [((2, 3, 21, 17), 'n'), ((2, 3, 21, 40), 'n')],
                   dict(transpose_a=True)),
                  ('transpose_a transpose_b', [((6, 20, 33), 'n'), ((6, 37, 20), 'n')],
                   dict(transpose_a=True, transpose_b=True))],
    'InstanceNorm': [('', [_X, ((32,), 'g'), ((32,), 'w')], {})],
    'GroupNorm': [('', [_X, ((4,), 'g'), ((4,), 'w')], dict(num_groups=4))],
    'BatchNorm': [('', [_X, ((32,), 'g'), ((32,), 'w'), ((32,), 'a'), ((32,), 'a')],
                   dict(fix_gamma=False))],
    '_contrib_BatchNormWithReLU': [
        ('', [_X, ((32,), 'g'), ((32,), 'w'), ((32,), 'a'), ((32,), 'a')],
         dict(fix_gamma=False))],
    'LRN': [('nsize=5', [_X], dict(nsize=5))],
    'Pooling': [('max 2x2', [_X], dict(pool_type='max', kernel=(2, 2), stride=(2, 2))),
                ('avg 2x2', [_X], dict(pool_type='avg', kernel=(2, 2), stride=(2, 2))),
                ('global avg', [_X], dict(pool_type='avg', kernel=(1, 1), global_pool=True))],
    '_contrib_AdaptiveAvgPooling2D': [('4x4', [_X], dict(output_size=(4, 4)))],
    '_contrib_BilinearResize2D': [('32x32', [_X], dict(height=32, width=32))],
    # -- FOLLOW: shape and copy ------------------------------------------------------------
    'Flatten': _one(NCHW), 'Reshape': _one(NCHW, shape=(4, 32, 256)),
    'SwapAxis': _one(dim1=1, dim2=2), 'expand_dims': _one(axis=1),
    'SliceChannel': [('2 outputs', [_X], dict(num_outputs=2, axis=1))],
    '_split_v2': [('2 outputs', [_X], dict(indices=(0, 16), axis=1))],
    'slice': _one(NCHW, begin=(0, 0, 2, 2), end=(4, 16, 14, 14)),
    'slice_axis': _one(axis=1, begin=4, end=20),
    'slice_like': [('', [_T, ((8, 16, 32), 'n')], {})],
    'reshape_like': [('', [_X, ((4, 32, 256), 'n')], {})],
    'broadcast_like': [('', [_SMALL, _T], {})],
    'broadcast_axis': [('', [_SMALL], dict(axis=1, size=32))],
    'broadcast_to': [('', [_SMALL], dict(shape=BTF))],
    'squeeze': [('', [_SMALL], dict(axis=1))],
    'tile': _one(reps=(1, 2, 1)), 'repeat': _one(repeats=2, axis=1),
    'reverse': _one(axis=1), 'diag': _one((64, 64)),
    'depth_to_space': _one(NCHW, block_size=2), 'space_to_depth': _one(NCHW, block_size=2),
    'transpose': [('NCHW axes (0,2,1,3)', [_X], dict(axes=(0, 2, 1, 3))),
                  ('BTF axes (0,2,1)', [_T], dict(axes=(0, 2, 1)))],
    'cast_storage': _one(NCHW, stype='default'),
    'ones_like': _one(), 'zeros_like': _one(), 'shape_array': _one(), 'size_array': _one(),
    '_contrib_index_array': _one(),
    '_slice_assign_scalar': _one(begin=(0, 8, 0), end=(8, 24, 64), scalar=1.0),
    '_shuffle': _one(),  # the same mx.random.seed gives both runs the same permutation
    '_copy': _one(NCHW), 'BlockGrad': _one(NCHW),
    '_contrib_gradientmultiplier': _one(NCHW, scalar=0.5),
    '_contrib_div_sqrt_dim': _one(),
    # -- FOLLOW: gather ---------------------------------------------------------------------
    'Embedding': [('', [((8, 32), 'i1000'), ((1000, 64), 'n')],
                   dict(input_dim=1000, output_dim=64))],
    '_contrib_SparseEmbedding': [('', [((8, 32), 'i1000'), ((1000, 64), 'n')],
                                  dict(input_dim=1000, output_dim=64))],
    'take': [('', [((1000, 64), 'n'), ((8, 32), 'i1000')], {})],
    'batch_take': [('', [((256, 64), 'n'), ((256,), 'I64')], {})],
    'pick': [('axis=1', [((256, 64), 'n'), ((256,), 'i64')], dict(axis=1))],
    'gather_nd': [('', [((64, 64), 'n'), ((2, 128), 'i64')], {})],
    'scatter_nd': [('', [((128,), 'n'), ((2, 128), 's64')], dict(shape=(64, 64)))],
    'SequenceLast': [('', [((32, 8, 64), 'n'), ((8,), 'l32')], dict(use_sequence_length=True))],
    'SequenceMask': [('', [((32, 8, 64), 'n'), ((8,), 'l32')], dict(use_sequence_length=True))],
    'SequenceReverse': [('', [((32, 8, 64), 'n'), ((8,), 'l32')],
                         dict(use_sequence_length=True))],
    # -- FOLLOW: pointwise math -------------------------------------------------------------
    'clip': _one(a_min=-1.0, a_max=1.0), 'max': _one(axis=2), 'min': _one(axis=2),
    'sqrt': _one(kind='p'), 'arccosh': _one(kind='c'), 'logical_not': _one(kind='m'),
    '_rmod_scalar': _one(kind='p', scalar=2.0), '_mod_scalar': _one(scalar=0.7),
    '_div_scalar': _one(scalar=3.0), '_mul_scalar': _one(scalar=0.5),
    '_plus_scalar': _one(scalar=3.0), '_minus_scalar': _one(scalar=3.0),
    '_rminus_scalar': _one(scalar=3.0), '_maximum_scalar': _one(scalar=0.0),
    '_minimum_scalar': _one(scalar=0.0), '_scatter_plus_scalar': _one(scalar=3.0),
    '_scatter_minus_scalar': _one(scalar=3.0),
    '_contrib_round_ste': _one(NCHW), '_contrib_sign_ste': _one(NCHW),
}
for _op in ('abs', 'arcsinh', 'arctan', 'cbrt', 'ceil', 'cos', 'degrees', 'erf', 'fix', 'floor',
            'negative', 'radians', 'relu', 'rint', 'round', 'sigmoid', 'sign', 'sin', 'softsign',
            'square', 'tanh', 'trunc'):
    CASES[_op] = _one(NCHW)
for _op in _CMP:
    CASES[_op] = _two()
    CASES['broadcast' + _op] = _two(shapes=_BCAST)
    CASES[_op + '_scalar'] = _one(scalar=0.5)
for _op in ('_logical_and_scalar', '_logical_or_scalar', '_logical_xor_scalar'):
    CASES[_op] = _one(kind='m', scalar=1.0)

#: Ops whose output is random per run (a fresh mask): two runs cannot be compared, so they have
#: the library case only (checked against the op's definition, mxmp/_src/conformance/library.py).
RANDOM_OPS = ('Dropout',)

NOT_TESTED = {
    '_CrossDeviceCopy': 'inserted by the executor between two devices; a one-op graph on one '
                        'CPU cannot contain it',
    '_copyto': "NDArray.copyto's op: it registers no type inference (Symbol.infer_type "
               "returns None), so no typed graph can hold it",
    '_scatter_set_nd': "in-place op of NDArray.__setitem__: its output must be its first "
                       "input's memory (Check failed: inputs[0].dptr_ == outputs[0].dptr_), "
                       "which a bound executor does not arrange",
    '_contrib_boolean_mask': 'output shape depends on the mask values: a bound executor '
                             '(simple_bind) cannot infer it',
}
