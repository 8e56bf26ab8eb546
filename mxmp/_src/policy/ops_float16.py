"""Operator classes for the float16 target dtype that differ from bfloat16's (MXNet 1.9.1).
Data only.

The float16 table is :mod:`mxmp._src.policy.ops_shared` (the ops whose class is the same for both
target dtypes) plus this module, which holds only the ops whose float16 class differs from their
bfloat16 class, and the float16-only rules (CONDITIONAL_FLOAT32, EMULATE_FLOAT32);
:mod:`mxmp._src.policy.tables` merges the two and refuses an op listed in both. Together they put
every operator name MXNet 1.9.1 registers (``mx.operator.get_all_registered_operators()``) in
exactly one of LOW_PRECISION, FLOAT32, LOSS_OUTPUT, WIDEST_TYPE, FOLLOW, or a rule in
``EXCLUDED_PREFIXES`` of ``tables.py`` excludes it. Each class is ``{group: (op, ...)}``, with the
evidence of each group in the legend above it. Aliases (``_plus``, ``_Plus`` of ``elemwise_add``)
are not listed: ``tables.py`` gives each its canonical op's class and entries, from MXNet's
registry; a Symbol's JSON always names the canonical op.

Where the facts come from:

- Which ops gain from float16 and which need float32: NVIDIA, "Training with Mixed Precision"
  (Deep Learning Performance documentation) and Micikevicius et al., "Mixed Precision Training",
  ICLR 2018: matrix products and convolutions in float16 with float32 accumulation; reductions,
  exponentials, softmax and normalization statistics in float32.
- Kernel and type-inference facts: MXNet 1.9.1 sources (src/operator/nn/batch_norm.cc
  BatchNormType, src/operator/nn/convolution.cc, src/operator/nn/fully_connected-inl.h,
  src/operator/tensor/dot-inl.h, src/operator/contrib/transformer.cc) and runs of every op with
  float16 inputs on CPU with the 1.9.1 wheel. float16 Convolution, Deconvolution,
  FullyConnected, RNN, dot and batch_dot have GPU (cuDNN/cuBLAS) kernels only; every FOLLOW and
  WIDEST_TYPE op runs in float16 on CPU (tests/policy/test_op_coverage.py runs them).
- contrib.amp's own lists (mxnet/contrib/amp/lists/symbol_fp16.py), read for facts and not imported.
  Differences: ops it calls dtype-neutral that have no float16 kernel (Crop, GridGenerator, sort,
  SpatialTransformer, BatchNorm_v1) are FLOAT32 here; argmax/argmin/arange_like are FLOAT32
  because float16 holds integers exactly only up to 2048.
"""

# ------------------------------------------------------------------------------------------------
# LOW_PRECISION: Run in the target dtype: every float input is cast to it.
# Its groups, the keys of the dict:
#   gemm: convolution, fully connected, recurrent and (batched) matrix products: the compute-bound
#       ops that gain from float16 Tensor Cores and that NVIDIA's guide and Micikevicius et al. 2018
#       run in float16 with float32 accumulation. MXNet 1.9.1 has their float16 kernels in
#       cuDNN/cuBLAS only: on CPU they fail ("FP16 gemm on cpu not implemented!", "float16 fully
#       connected layer is currently only supported by CuDNN", "Only FP32 is supported on CPU" for
#       the interleaved attention matmuls; measured), so CPU runs use emulation.
LOW_PRECISION = {
    'gemm': ('Deconvolution', 'RNN', '_contrib_interleaved_matmul_encdec_qk',
             '_contrib_interleaved_matmul_encdec_valatt', '_contrib_interleaved_matmul_selfatt_qk',
             '_contrib_interleaved_matmul_selfatt_valatt', 'batch_dot', 'dot'),
}

# ------------------------------------------------------------------------------------------------
# FLOAT32: Compute in float32: low-precision float inputs are cast to float32. The safe default.
# Its groups, the keys of the dict:
#   norm: normalizations whose mean/variance/sum of squares need float32 (NVIDIA guide).
#       BatchNorm_v1 and _contrib_SyncBatchNorm infer float32 parameters for float16 data but their
#       kernels read the parameters as float16 (TBlob "Expected: half v.s. given float", measured);
#       _contrib_BatchNormWithReLU is oneDNN-only and has no float16 kernel; InstanceNorm and LRN
#       have no float16 CPU kernel.
#   pow: powers, reciprocals and squares overflow float16 (max 65504) or lose precision.
FLOAT32 = {
    'norm': ('LRN', '_contrib_BatchNormWithReLU'),
    'pow': ('square',),
}

# ------------------------------------------------------------------------------------------------
# WIDEST_TYPE: Several float inputs that MXNet requires in one dtype: all cast to the widest.
# Its groups, the keys of the dict:
#   binary: elementwise and broadcast binary ops: MXNet requires both inputs in one dtype (type
#       inference fails otherwise, checked), so both are cast to the wider one.
#   join: ops joining several float tensors that must share one dtype (Concat, stack, add_n, where's
#       x/y, slice assignment, RNN parameter concat).
#   sampler: spatial samplers, ROI ops, Correlation and multi-input UpSampling: their float inputs
#       must share one dtype (checked); float16 CPU kernels exist (checked). The rois and grids
#       usually arrive in float32, so the widest dtype then keeps the op in float32.
WIDEST_TYPE = {
    'binary': ('_grad_add', '_mod', 'broadcast_div', 'broadcast_mod', 'broadcast_mul'),
    'join': ('_scatter_set_nd',),
    'sampler': ('BilinearSampler', 'Correlation', 'ROIPooling', 'UpSampling',
                '_contrib_PSROIPooling', '_contrib_ROIAlign', '_contrib_RROIAlign'),
}

# ------------------------------------------------------------------------------------------------
# FOLLOW: Keep their input's dtype (treated like WIDEST_TYPE; they never cast down).
# Its groups, the keys of the dict:
#   activation: pointwise activations, bounded or dtype-safe (Activation softrelu is float32 by
#       CONDITIONAL_FLOAT32).
#   pooling: pooling and resizing keep their input's dtype (Pooling lp is float32 by
#       CONDITIONAL_FLOAT32).
#   shape: layout, shape and copy ops: no arithmetic.
#   gather: gather/scatter/embedding/sequence ops: the float input keeps its dtype, the index/length
#       input is in INDEX_INPUTS and never cast.
#   math: pointwise math that stays in range and accurate in float16, scalar arithmetic, comparisons
#       and max/min reductions (no accumulation).
#   identity: identity-like ops: copies, gradient blocking/scaling, Dropout (Cast is float32, see
#       explicit-cast), random *_like (input read for its shape and dtype only).
FOLLOW = {
    'activation': ('hard_sigmoid',),
    'pooling': ('Pooling_v1', '_contrib_AdaptiveAvgPooling2D', '_contrib_BilinearResize2D'),
    'shape': ('Pad', 'col2im', 'im2col', 'transpose'),
    'gather': ('_contrib_SparseEmbedding', '_contrib_boolean_mask', 'gather_nd'),
    'math': ('_mod_scalar', '_plus_scalar', '_rmod_scalar'),
    'identity': ('Dropout', '_CrossDeviceCopy', '_copyto', '_random_exponential_like',
                 '_random_gamma_like', '_random_generalized_negative_binomial_like',
                 '_random_negative_binomial_like', '_random_normal_like', '_random_poisson_like',
                 '_random_uniform_like'),
}

# ------------------------------------------------------------------------------------------------
# CONDITIONAL_FLOAT32: (op, attr, values): the op is FLOAT32 when attr has one of the values.
CONDITIONAL_FLOAT32 = (
    # softrelu = log(1 + exp(x)): exponential (contrib.amp CONDITIONAL_FP32_FUNCS).
    ('Activation', 'act_type', ('softrelu',)),
    # elu/selu evaluate exp(x) - 1 (contrib.amp CONDITIONAL_FP32_FUNCS).
    ('LeakyReLU', 'act_type', ('elu', 'selu')),
    # lp pooling raises to the p-th power: overflow above 256 for p=2 in float16.
    ('Pooling', 'pool_type', ('lp',)),
    # bilinear upsampling is a Deconvolution with a weight input: no float16 CPU kernel
    # ("FP16 gemm on cpu not implemented!", measured); nearest upsampling runs in float16.
    ('UpSampling', 'sample_type', ('bilinear',)),
)

# EMULATE_FLOAT32: {op: reason}: ops that compute in float32 when the graph is emulated (float32
# kernels with float16 rounding, i.e. float16 on a CPU), because emulation would crash them.
EMULATE_FLOAT32 = {
    # MXNet 1.9.1's CPU Deconvolution fails in training (forward then backward) when its weight
    # is computed by another node (`w * 1.0`, `amp_cast(w, dtype='float32')`): SIGSEGV or
    # "could not execute a primitive", in float32 too, with oneDNN fusion on or off and with
    # DNNL_MAX_CPU_ISA=AVX2 (`mxmp check-kernels --dtype float16 --ops Deconvolution`: cast case
    # crash(SIGSEGV); the script in docs/conformance.md). Emulation rounds the weight through
    # amp_cast nodes, so a low-precision Deconvolution gets a computed weight; in float32 its
    # weight stays a graph input and it runs. GPUs (real float16 kernels) keep it LOW_PRECISION.
    'Deconvolution': 'emulated on CPU, MXNet 1.9.1 Deconvolution crashes in training when its '
                     'weight is computed (the rounding casts); see docs/float16.md',
}
