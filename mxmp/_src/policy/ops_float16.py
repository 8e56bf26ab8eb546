"""Operator classes for the float16 target dtype that differ from bfloat16's (MXNet 1.9.1).
Data only.

The float16 table is :mod:`mxmp._src.policy.ops_shared` (the ops whose class is the same for both
target dtypes) plus this module, which holds only the ops whose float16 class differs from their
bfloat16 class, and the float16-only rules (CONDITIONAL_FLOAT32, EMULATE_FLOAT32);
:mod:`mxmp._src.policy.tables` merges the two and refuses an op listed in both. Together they put every
operator name MXNet 1.9.1 registers (``mx.operator.get_all_registered_operators()``) in exactly one
of LOW_PRECISION, FLOAT32, LOSS_OUTPUT, WIDEST_TYPE, FOLLOW, or a rule in
``EXCLUDED_PREFIXES`` of ``tables.py`` excludes it. Aliases are listed under each of their names (``_plus``,
``_Plus``, ``elemwise_add``); a Symbol's JSON always names the canonical op.

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
# The comment after each name is its group:
#   gemm: convolution, fully connected, recurrent and (batched) matrix products: the compute-bound
#       ops that gain from float16 Tensor Cores and that NVIDIA's guide and Micikevicius et al. 2018
#       run in float16 with float32 accumulation. MXNet 1.9.1 has their float16 kernels in
#       cuDNN/cuBLAS only: on CPU they fail ("FP16 gemm on cpu not implemented!", "float16 fully
#       connected layer is currently only supported by CuDNN", "Only FP32 is supported on CPU" for
#       the interleaved attention matmuls; measured), so CPU runs use emulation.
LOW_PRECISION = (
    'Deconvolution',                               # gemm
    'RNN',                                         # gemm
    '_contrib_interleaved_matmul_encdec_qk',       # gemm
    '_contrib_interleaved_matmul_encdec_valatt',   # gemm
    '_contrib_interleaved_matmul_selfatt_qk',      # gemm
    '_contrib_interleaved_matmul_selfatt_valatt',  # gemm
    '_sparse_dot',                                 # gemm (alias of dot)
    'batch_dot',                                   # gemm
    'dot',                                         # gemm
)

# ------------------------------------------------------------------------------------------------
# FLOAT32: Compute in float32: low-precision float inputs are cast to float32. The safe default.
# The comment after each name is its group:
#   norm: normalizations whose mean/variance/sum of squares need float32 (NVIDIA guide).
#       BatchNorm_v1 and _contrib_SyncBatchNorm infer float32 parameters for float16 data but their
#       kernels read the parameters as float16 (TBlob "Expected: half v.s. given float", measured);
#       _contrib_BatchNormWithReLU is oneDNN-only and has no float16 kernel; InstanceNorm and LRN
#       have no float16 CPU kernel.
#   pow: powers, reciprocals and squares overflow float16 (max 65504) or lose precision.
FLOAT32 = (
    'LRN',                                         # norm
    '_contrib_BatchNormWithReLU',                  # norm
    '_sparse_square',                              # pow (alias of square)
    'square',                                      # pow
)

# ------------------------------------------------------------------------------------------------
# WIDEST_TYPE: Several float inputs that MXNet requires in one dtype: all cast to the widest.
# The comment after each name is its group:
#   binary: elementwise and broadcast binary ops: MXNet requires both inputs in one dtype (type
#       inference fails otherwise, checked), so both are cast to the wider one.
#   join: ops joining several float tensors that must share one dtype (Concat, stack, add_n, where's
#       x/y, slice assignment, RNN parameter concat).
#   sampler: spatial samplers, ROI ops, Correlation and multi-input UpSampling: their float inputs
#       must share one dtype (checked); float16 CPU kernels exist (checked). The rois and grids
#       usually arrive in float32, so the widest dtype then keeps the op in float32.
WIDEST_TYPE = (
    'BilinearSampler',                             # sampler
    'Correlation',                                 # sampler
    'ROIPooling',                                  # sampler
    'UpSampling',                                  # sampler
    '_Mod',                                        # binary (alias of _mod)
    '_contrib_PSROIPooling',                       # sampler
    '_contrib_ROIAlign',                           # sampler
    '_contrib_RROIAlign',                          # sampler
    '_grad_add',                                   # binary
    '_mod',                                        # binary
    '_scatter_set_nd',                             # join
    '_sparse_broadcast_div',                       # binary (alias of broadcast_div)
    '_sparse_broadcast_mul',                       # binary (alias of broadcast_mul)
    'broadcast_div',                               # binary
    'broadcast_mod',                               # binary
    'broadcast_mul',                               # binary
)

# ------------------------------------------------------------------------------------------------
# FOLLOW: Keep their input's dtype (treated like WIDEST_TYPE; they never cast down).
# The comment after each name is its group:
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
FOLLOW = (
    'Dropout',                                     # identity
    'Pad',                                         # shape
    'Pooling_v1',                                  # pooling
    '_CrossDeviceCopy',                            # identity
    '_ModScalar',                                  # math (alias of _mod_scalar)
    '_PlusScalar',                                 # math (alias of _plus_scalar)
    '_RModScalar',                                 # math (alias of _rmod_scalar)
    '_contrib_AdaptiveAvgPooling2D',               # pooling
    '_contrib_BilinearResize2D',                   # pooling
    '_contrib_SparseEmbedding',                    # gather
    '_contrib_boolean_mask',                       # gather
    '_copyto',                                     # identity
    '_mod_scalar',                                 # math
    '_plus_scalar',                                # math
    '_random_exponential_like',                    # identity
    '_random_gamma_like',                          # identity
    '_random_generalized_negative_binomial_like',  # identity
    '_random_negative_binomial_like',              # identity
    '_random_normal_like',                         # identity
    '_random_poisson_like',                        # identity
    '_random_uniform_like',                        # identity
    '_rmod_scalar',                                # math
    'col2im',                                      # shape
    'gather_nd',                                   # gather
    'hard_sigmoid',                                # activation
    'im2col',                                      # shape
    'pad',                                         # shape (alias of Pad)
    'transpose',                                   # shape
)

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
