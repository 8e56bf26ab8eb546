"""Operator classes that are the same for the float16 and bfloat16 target dtypes (MXNet 1.9.1).
Data only.

An op is listed here when its class and group are the same for both target dtypes; the ops whose
class differs are in :mod:`mxmp._src.policy.ops_float16` and :mod:`mxmp._src.policy.ops_bfloat16`
(one entry each, with the evidence for that dtype), and :mod:`mxmp._src.policy.tables` merges this
module with one of them into the dtype's table (an op listed both here and in a dtype's module is
an error there). So adding an op that behaves alike in both dtypes is one edit, here.

Every operator name MXNet 1.9.1 registers (``mx.operator.get_all_registered_operators()``) is in
exactly one class of each merged table, or a rule in ``EXCLUDED_PREFIXES`` of ``tables.py``
excludes it (tests/policy/test_op_coverage.py enforces it). Each class is ``{group: (op, ...)}``,
with the evidence of each group in the legend above it. Aliases are not listed: ``tables.py`` gives
each its canonical op's class and entries (rules, input positions), from MXNet's registry; a
Symbol's JSON always names the canonical op. Where a group's reason differs between the dtypes,
its legend gives both (``float16:``, ``bfloat16:``); the sources are those named in ops_float16.py
and ops_bfloat16.py: NVIDIA's "Training with Mixed Precision" guide, Micikevicius et al., "Mixed
Precision Training", ICLR 2018, MXNet 1.9.1's sources, contrib.amp's lists (read for facts, not
imported) and runs of every op on CPU with the 1.9.1 wheel (``mxmp check-kernels``).
"""

# ------------------------------------------------------------------------------------------------
# LOW_PRECISION: Run in the target dtype: every float input is cast to it.
# Its groups, the keys of the dict:
#   gemm:
#     float16: convolution, fully connected, recurrent and (batched) matrix products: the
#       compute-bound ops that gain from float16 Tensor Cores and that NVIDIA's guide and
#       Micikevicius et al. 2018 run in float16 with float32 accumulation. MXNet 1.9.1 has their
#       float16 kernels in cuDNN/cuBLAS only: on CPU they fail ("FP16 gemm on cpu not implemented!",
#       "float16 fully connected layer is currently only supported by CuDNN", "Only FP32 is
#       supported on CPU" for the interleaved attention matmuls; measured), so CPU runs use
#       emulation.
#     bfloat16: convolution (dense and grouped/depthwise) and fully connected: oneDNN bfloat16
#       kernels in MXNet 1.9.1 (src/operator/nn/mkldnn/*; contrib.amp BF16_FUNCS), correct on real
#       kernels (`mxmp check-kernels`: forward <= 0.0030, backward <= 0.0035). They need
#       avx512_bf16/AMX: on an AVX2-only CPU they raise "could not create a primitive descriptor
#       iterator" (measured), so there use emulation. Deconvolution: bf16-crash.
LOW_PRECISION = {
    'gemm': ('Convolution', 'FullyConnected'),
}

# ------------------------------------------------------------------------------------------------
# FLOAT32: Compute in float32: low-precision float inputs are cast to float32. The safe default.
# Its groups, the keys of the dict:
#   norm:
#     float16: normalizations whose mean/variance/sum of squares need float32 (NVIDIA guide).
#       BatchNorm_v1 and _contrib_SyncBatchNorm infer float32 parameters for float16 data but their
#       kernels read the parameters as float16 (TBlob "Expected: half v.s. given float", measured);
#       _contrib_BatchNormWithReLU is oneDNN-only and has no float16 kernel; InstanceNorm and LRN
#       have no float16 CPU kernel.
#     bfloat16: normalizations whose statistics need float32. BatchNorm_v1 and
#       _contrib_SyncBatchNorm infer bfloat16 parameters and have no bfloat16 kernel; LayerNorm,
#       GroupNorm, InstanceNorm and L2Normalization have no bfloat16 kernel in 1.9.1 either.
#   softmax: softmax family: exponentials and a sum over the axis (Micikevicius et al.; contrib.amp
#       FP32_FUNCS).
#   exp-log:
#     float16: exponentials and logarithms overflow or lose precision in float16 (Micikevicius et
#       al. 2018; NVIDIA guide).
#     bfloat16: exponentials and logarithms: bfloat16 keeps float32's range but only 8 significant
#       bits.
#   pow:
#     float16: powers, reciprocals and squares overflow float16 (max 65504) or lose precision.
#     bfloat16: powers and reciprocals: precision loss with 8 significant bits (square is FOLLOW:
#       bfloat16 has float32's range, contrib.amp BF16_FP32_FUNCS).
#   trig: trigonometric/hyperbolic functions that overflow or are ill-conditioned near their poles
#       or domain ends (contrib.amp FP32_FUNCS).
#   reduce:
#     float16: sum-like reductions: a float16 accumulator overflows and loses small addends (NVIDIA
#       guide: reductions in float32).
#     bfloat16: sum-like reductions: a bfloat16 accumulator drops addends below 2^-8 of the running
#       sum.
#   index-out:
#     float16: outputs are indices or positions held in a float dtype; float16 holds integers
#       exactly only up to 2048 (argsort also has no float16 kernel).
#     bfloat16: outputs are indices or positions held in a float dtype; bfloat16 holds integers
#       exactly only up to 256 (topk/argsort also lack a bfloat16 kernel).
#   linalg: dense linear algebra: LAPACK/BLAS kernels are float32/float64 only ("This operation only
#       supports 32-bit and 64-bit floating point") and ill-conditioned in low precision.
#   conv-variant:
#     float16: convolution variants without a float16 kernel in 1.9.1 (legacy v1, deformable, oneDNN
#       fused subgraph ops); contrib.amp keeps them float32 too.
#     bfloat16: convolution variants without a bfloat16 kernel in 1.9.1 (legacy v1, deformable) or
#       whose oneDNN fused subgraph form contrib.amp keeps float32.
#   detection: detection helpers on box coordinates: IoU thresholds, exp of box deltas and pixel
#       coordinates need float32; several have float32-only kernels.
#   elementwise-loss: elementwise loss/regularizer terms that feed a loss (not heads).
#   creation: create tensors from a dtype attribute or from distribution parameters (output float32
#       by default); the pdf ops evaluate exp/log.
#   optimizer: optimizer updates and gradient checks: run by the Trainer on float32 master weights,
#       never inside a model graph.
#   quantization:
#     float16: int8 quantization ops: mxmp does not mix int8 and float16.
#     bfloat16: int8 quantization ops: mxmp does not mix int8 and bfloat16.
#   image-io: data-pipeline image and decode ops: run before the network on float32/uint8 data.
#   subgraph: ops that wrap another graph or Python code (Custom, control flow, cached ops): mxmp
#       does not convert their inner graph, so their boundary stays float32.
#   internal: gradient helpers and legacy NDArray internals; not in a forward Symbol.
#   index-math: inputs or outputs are integer indices, counts or bin edges (one_hot's output dtype
#       comes from its dtype attribute).
#   graph-sparse: graph (DGL) and sparse-storage helpers on integer/CSR data.
#   spectral: FFT and count sketch: GPU-only float32 kernels in 1.9.1.
#   explicit-cast: Cast's output dtype is its dtype attribute, an explicit choice of the graph's
#       author: its input is float32 and MXNet's type inference gives its output.
#   no-kernel:
#     float16: no float16 kernel in MXNet 1.9.1, measured on CPU: Crop rejects float16 in type
#       inference, GridGenerator raises "Other DTypes are not supported!", sort "This operation does
#       not support float16"; SpatialTransformer has no float16 CPU kernel ("FP16 gemm on cpu not
#       implemented!") and samples through a grid that needs float32 precision.
#     bfloat16: no bfloat16 kernel in MXNet 1.9.1, measured on CPU: their kernels switch over
#       float32/float64/float16 only ("Unknown type enum 12"), accept float32 only (dot and
#       batch_dot: float16 on GPU only; the interleaved attention matmuls: "Only FP32 is supported
#       on CPU") or reject bfloat16 in type inference. This includes RNN, Dropout, Pad, UpSampling,
#       the samplers and the ROI ops; contrib.amp also keeps RNN, Dropout and Pad float32 for
#       bfloat16. gather_nd's forward runs but its backward has no bfloat16 kernel ("Unknown type
#       enum 12", `mxmp check-kernels`, real kernels and AVX2 alike).
FLOAT32 = {
    'norm': ('BatchNorm_v1', 'GroupNorm', 'InstanceNorm', 'L2Normalization', 'LayerNorm',
             '_contrib_SyncBatchNorm', 'moments'),
    'softmax': ('SoftmaxActivation', 'log_softmax', 'softmax', 'softmin'),
    'exp-log': ('_contrib_hawkesll', 'erfinv', 'exp', 'expm1', 'gamma', 'gammaln', 'log', 'log10',
                'log1p', 'log2'),
    'pow': ('_contrib_quadratic', '_hypot', '_hypot_scalar', '_power', '_power_scalar',
            '_rdiv_scalar', '_rpower_scalar', '_square_sum', 'broadcast_hypot', 'broadcast_power',
            'rcbrt', 'reciprocal', 'rsqrt'),
    'trig': ('arccos', 'arcsin', 'arctanh', 'cosh', 'sinh', 'tan'),
    'reduce': ('_np_cumsum', 'mean', 'nanprod', 'nansum', 'norm', 'prod', 'sum'),
    'index-out': ('_contrib_arange_like', 'argmax', 'argmax_channel', 'argmin', 'argsort', 'topk'),
    'linalg': ('_linalg_det', '_linalg_extractdiag', '_linalg_extracttrian', '_linalg_gelqf',
               '_linalg_gemm', '_linalg_gemm2', '_linalg_inverse', '_linalg_makediag',
               '_linalg_maketrian', '_linalg_potrf', '_linalg_potri', '_linalg_slogdet',
               '_linalg_sumlogdiag', '_linalg_syevd', '_linalg_syrk', '_linalg_trmm',
               '_linalg_trsm', 'khatri_rao'),
    'conv-variant': ('Convolution_v1', '_contrib_DeformableConvolution',
                     '_contrib_ModulatedDeformableConvolution', '_sg_mkldnn_conv',
                     '_sg_mkldnn_fully_connected', '_sg_mkldnn_selfatt_qk',
                     '_sg_mkldnn_selfatt_valatt'),
    'detection': ('_contrib_DeformablePSROIPooling', '_contrib_MultiBoxDetection',
                  '_contrib_MultiBoxPrior', '_contrib_MultiBoxTarget', '_contrib_MultiProposal',
                  '_contrib_Proposal', '_contrib_bipartite_matching', '_contrib_box_decode',
                  '_contrib_box_encode', '_contrib_box_iou', '_contrib_box_nms'),
    'elementwise-loss': ('IdentityAttachKLSparseReg', 'smooth_l1'),
    'creation': ('_arange', '_eye', '_full', '_linspace', '_ones', '_random_exponential',
                 '_random_gamma', '_random_generalized_negative_binomial',
                 '_random_negative_binomial', '_random_normal', '_random_pdf_dirichlet',
                 '_random_pdf_exponential', '_random_pdf_gamma',
                 '_random_pdf_generalized_negative_binomial', '_random_pdf_negative_binomial',
                 '_random_pdf_normal', '_random_pdf_poisson', '_random_pdf_uniform',
                 '_random_poisson', '_random_randint', '_random_uniform', '_sample_exponential',
                 '_sample_gamma', '_sample_generalized_negative_binomial', '_sample_multinomial',
                 '_sample_negative_binomial', '_sample_normal', '_sample_poisson',
                 '_sample_uniform', '_sample_unique_zipfian', '_zeros', '_zeros_without_dtype'),
    'optimizer': ('_adamw_update', '_contrib_group_adagrad_update', '_mp_adamw_update',
                  '_multi_adamw_update', '_multi_lamb_update', '_multi_mp_adamw_update',
                  '_multi_mp_lamb_update', '_sparse_adagrad_update', 'adam_update', 'all_finite',
                  'ftml_update', 'ftrl_update', 'lamb_update_phase1', 'lamb_update_phase2',
                  'mp_lamb_update_phase1', 'mp_lamb_update_phase2', 'mp_nag_mom_update',
                  'mp_sgd_mom_update', 'mp_sgd_update', 'multi_all_finite', 'multi_lars',
                  'multi_mp_sgd_mom_update', 'multi_mp_sgd_update', 'multi_sgd_mom_update',
                  'multi_sgd_update', 'multi_sum_sq', 'nag_mom_update',
                  'preloaded_multi_mp_sgd_mom_update', 'preloaded_multi_mp_sgd_update',
                  'preloaded_multi_sgd_mom_update', 'preloaded_multi_sgd_update', 'reset_arrays',
                  'rmsprop_update', 'rmspropalex_update', 'sgd_mom_update', 'sgd_update',
                  'signsgd_update', 'signum_update'),
    'quantization': ('_contrib_calibrate_entropy', '_contrib_dequantize', '_contrib_quantize',
                     '_contrib_quantize_asym', '_contrib_quantize_v2', '_contrib_quantized_act',
                     '_contrib_quantized_batch_norm', '_contrib_quantized_concat',
                     '_contrib_quantized_conv', '_contrib_quantized_elemwise_add',
                     '_contrib_quantized_elemwise_mul', '_contrib_quantized_embedding',
                     '_contrib_quantized_flatten', '_contrib_quantized_fully_connected',
                     '_contrib_quantized_pooling', '_contrib_quantized_rnn', '_contrib_requantize'),
    'image-io': ('_cvcopyMakeBorder', '_cvimdecode', '_cvimread', '_cvimresize',
                 '_image_adjust_lighting', '_image_crop', '_image_flip_left_right',
                 '_image_flip_top_bottom', '_image_normalize', '_image_random_brightness',
                 '_image_random_color_jitter', '_image_random_contrast',
                 '_image_random_flip_left_right', '_image_random_flip_top_bottom',
                 '_image_random_hue', '_image_random_lighting', '_image_random_saturation',
                 '_image_resize', '_image_to_tensor', '_imdecode'),
    'subgraph': ('Custom', '_CachedOp', '_CachedOpThreadSafe', '_CustomFunction', '_NDArray',
                 '_Native', '_cond', '_foreach', '_while_loop'),
    'internal': ('_NoGradient', '_broadcast_backward', '_onehot_encode', '_set_value',
                 '_split_v2_backward', 'fill_element_0index'),
    'index-math': ('_contrib_allclose', '_histogram', '_ravel_multi_index', '_unravel_index',
                   'one_hot'),
    'graph-sparse': ('_contrib_dgl_adjacency', '_contrib_dgl_csr_neighbor_non_uniform_sample',
                     '_contrib_dgl_csr_neighbor_uniform_sample', '_contrib_dgl_graph_compact',
                     '_contrib_dgl_subgraph', '_contrib_edge_id', '_contrib_getnnz',
                     '_sparse_retain'),
    'spectral': ('_contrib_count_sketch', '_contrib_fft', '_contrib_ifft'),
    'explicit-cast': ('Cast',),
    'no-kernel': ('Crop', 'GridGenerator', 'SpatialTransformer', 'sort'),
}

# ------------------------------------------------------------------------------------------------
# LOSS_OUTPUT: Loss heads: treated as FLOAT32; listed apart so the Module can scale the loss.
# Its groups, the keys of the dict:
#   loss-head: loss heads: computed in float32; the Module puts the loss-scale node in front of
#       them.
LOSS_OUTPUT = {
    'loss-head': ('CTCLoss', 'LinearRegressionOutput', 'LogisticRegressionOutput',
                  'MAERegressionOutput', 'MakeLoss', 'SVMOutput', 'SoftmaxOutput', 'make_loss',
                  'softmax_cross_entropy'),
}

# ------------------------------------------------------------------------------------------------
# WIDEST_TYPE: Several float inputs that MXNet requires in one dtype: all cast to the widest.
# Its groups, the keys of the dict:
#   binary:
#     float16: elementwise and broadcast binary ops: MXNet requires both inputs in one dtype (type
#       inference fails otherwise, checked), so both are cast to the wider one.
#     bfloat16: elementwise and broadcast binary ops: both inputs must share one dtype; their
#       kernels include bfloat16 (checked on CPU) and are correct on real kernels at (8, 32, 64) and
#       (4, 32, 16, 16) by (1, 32, 1, 1) (`mxmp check-kernels`; broadcast_mul, broadcast_div and the
#       mod ops are not: see bf16-inexact and bf16-mod).
#   join:
#     float16: ops joining several float tensors that must share one dtype (Concat, stack, add_n,
#       where's x/y, slice assignment, RNN parameter concat).
#     bfloat16: ops joining several float tensors that must share one dtype; bfloat16 kernels
#       checked on CPU (Concat also in contrib.amp BF16_FP32_FUNCS).
#   leaky-relu:
#     float16: LeakyReLU: prelu's gamma must have data's dtype; elu/selu are float32 by
#       CONDITIONAL_FLOAT32.
#     bfloat16: LeakyReLU: leaky/gelu have oneDNN bfloat16 kernels; elu/selu (numerics) and
#       prelu/rrelu (no bfloat16 kernel) are float32 by CONDITIONAL_FLOAT32.
WIDEST_TYPE = {
    'binary': ('_equal', '_greater', '_greater_equal', '_identity_with_attr_like_rhs', '_lesser',
               '_lesser_equal', '_logical_and', '_logical_or', '_logical_xor', '_maximum',
               '_minimum', '_not_equal', '_scatter_elemwise_div', 'broadcast_add',
               'broadcast_equal', 'broadcast_greater', 'broadcast_greater_equal',
               'broadcast_lesser', 'broadcast_lesser_equal', 'broadcast_logical_and',
               'broadcast_logical_or', 'broadcast_logical_xor', 'broadcast_maximum',
               'broadcast_minimum', 'broadcast_not_equal', 'broadcast_sub', 'elemwise_add',
               'elemwise_div', 'elemwise_mul', 'elemwise_sub'),
    'join': ('Concat', '_contrib_index_copy', '_rnn_param_concat', '_slice_assign', 'add_n',
             'stack', 'where'),
    'leaky-relu': ('LeakyReLU',),
}

# ------------------------------------------------------------------------------------------------
# FOLLOW: Keep their input's dtype (treated like WIDEST_TYPE; they never cast down).
# Its groups, the keys of the dict:
#   activation:
#     float16: pointwise activations, bounded or dtype-safe (Activation softrelu is float32 by
#       CONDITIONAL_FLOAT32).
#     bfloat16: pointwise activations: Activation relu/sigmoid/tanh use oneDNN bfloat16 kernels
#       (softrelu numerics and softsign, which has no bfloat16 kernel, are float32 by
#       CONDITIONAL_FLOAT32); relu, sigmoid, tanh, softsign ops run in bfloat16 on CPU (checked).
#   batchnorm:
#     float16: BatchNorm: float16 data, float32 gamma/beta/moving stats (FLOAT32_INPUTS);
#       BatchNormType in src/operator/nn/batch_norm.cc infers float32 parameters for float16 data
#       and cuDNN computes the statistics in float32. Runs on CPU in float16 (checked).
#     bfloat16: BatchNorm and _contrib_BatchNormWithReLU: bfloat16 data, float32 gamma/beta/moving
#       stats (FLOAT32_INPUTS); BatchNormType in src/operator/nn/batch_norm.cc infers float32
#       parameters for bfloat16 data and oneDNN computes the statistics in float32 (contrib.amp
#       BF16_FP32_FUNCS and BF16_USE_FP32_PARAMS).
#   pooling:
#     float16: pooling and resizing keep their input's dtype (Pooling lp is float32 by
#       CONDITIONAL_FLOAT32).
#     bfloat16: Pooling max/avg and LRN: oneDNN bfloat16 kernels (contrib.amp BF16_FP32_FUNCS);
#       sum/lp pooling have none and are float32 by CONDITIONAL_FLOAT32. Adaptive average pooling
#       and bilinear resize are bf16-inexact.
#   shape:
#     float16: layout, shape and copy ops: no arithmetic.
#     bfloat16: layout, shape and copy ops: no arithmetic; bfloat16 kernels checked on CPU and exact
#       on real kernels (`mxmp check-kernels`), except transpose (bf16-crash). SwapAxis moves the
#       same axes as the transpose that corrupts the heap and is exact.
#   gather:
#     float16: gather/scatter/embedding/sequence ops: the float input keeps its dtype, the
#       index/length input is in INDEX_INPUTS and never cast.
#     bfloat16: gather/scatter/embedding/sequence ops: the float input keeps its dtype, the
#       index/length input is in INDEX_INPUTS and never cast; bfloat16 kernels checked on CPU.
#   math:
#     float16: pointwise math that stays in range and accurate in float16, scalar arithmetic,
#       comparisons and max/min reductions (no accumulation).
#     bfloat16: pointwise math, scalar arithmetic, comparisons and max/min (no accumulation);
#       bfloat16 kernels checked on CPU (abs, clip, sqrt, square also in contrib.amp
#       BF16_FP32_FUNCS).
#   identity:
#     float16: identity-like ops: copies, gradient blocking/scaling, Dropout (Cast is float32, see
#       explicit-cast), random *_like (input read for its shape and dtype only).
#     bfloat16: identity-like ops: copies, gradient blocking/scaling (Cast is float32, see
#       explicit-cast); bfloat16 kernels checked on CPU.
FOLLOW = {
    'activation': ('Activation', '_contrib_round_ste', '_contrib_sign_ste', 'relu', 'sigmoid',
                   'softsign', 'tanh'),
    'batchnorm': ('BatchNorm',),
    'pooling': ('Pooling',),
    'shape': ('Flatten', 'Reshape', 'SliceChannel', 'SwapAxis', '_contrib_index_array', '_shuffle',
              '_slice_assign_scalar', '_split_v2', 'broadcast_axis', 'broadcast_like',
              'broadcast_to', 'cast_storage', 'depth_to_space', 'diag', 'expand_dims', 'ones_like',
              'repeat', 'reshape_like', 'reverse', 'shape_array', 'size_array', 'slice',
              'slice_axis', 'slice_like', 'space_to_depth', 'squeeze', 'tile', 'zeros_like'),
    'gather': ('Embedding', 'SequenceLast', 'SequenceMask', 'SequenceReverse', 'batch_take', 'pick',
               'scatter_nd', 'take'),
    'math': ('_contrib_div_sqrt_dim', '_div_scalar', '_equal_scalar', '_greater_equal_scalar',
             '_greater_scalar', '_lesser_equal_scalar', '_lesser_scalar', '_logical_and_scalar',
             '_logical_or_scalar', '_logical_xor_scalar', '_maximum_scalar', '_minimum_scalar',
             '_minus_scalar', '_mul_scalar', '_not_equal_scalar', '_rminus_scalar',
             '_scatter_minus_scalar', '_scatter_plus_scalar', 'abs', 'arccosh', 'arcsinh', 'arctan',
             'cbrt', 'ceil', 'clip', 'cos', 'degrees', 'erf', 'fix', 'floor', 'logical_not', 'max',
             'min', 'negative', 'radians', 'rint', 'round', 'sign', 'sin', 'sqrt', 'trunc'),
    'identity': ('BlockGrad', '_contrib_gradientmultiplier', '_copy'),
}

# ------------------------------------------------------------------------------------------------
# CONDITIONAL_FLOAT32: (op, attr, values) rules that are the same for both dtypes: none (the values
# differ for Activation, LeakyReLU and Pooling; UpSampling's rule is float16's only), so each
# dtype's module has its own.
CONDITIONAL_FLOAT32 = ()

# FLOAT32_INPUTS: input positions that stay float32 when the op runs in the target dtype.
FLOAT32_INPUTS = {
    # gamma, beta, moving_mean, moving_var: BatchNormType (src/operator/nn/batch_norm.cc) infers
    # float32 parameters for float16 and bfloat16 data; cuDNN keeps the statistics in float32
    # (float16), and so does oneDNN (bfloat16, contrib.amp BF16_USE_FP32_PARAMS).
    'BatchNorm': (1, 2, 3, 4),
}

# INDEX_INPUTS: input positions holding indices, lengths, masks or only a shape. The pass never
# casts them and they do not take part in the widest-dtype choice. MXNet's type inference lets
# these inputs keep their own dtype (checked; batch_take even requires int32 indices).
INDEX_INPUTS = {
    # CTCLoss(data, label, data_lengths, label_lengths): labels and lengths are integers.
    'CTCLoss': (1, 2, 3),
    'Embedding': (0,),
    # RNN(data, parameters, state, state_cell, sequence_length): position 4 is sequence_length
    # for LSTM with use_sequence_length=True. Other modes have no state_cell and put
    # sequence_length at 3, which this fixed-position format cannot express; lengths up to
    # 2048 are exact in float16 (and RNN is FLOAT32 for bfloat16).
    'RNN': (4,),
    'SequenceLast': (1,),
    'SequenceMask': (1,),
    'SequenceReverse': (1,),
    # the like-input of _contrib_BilinearResize2D(mode='like') is read for its shape only.
    '_contrib_BilinearResize2D': (1,),
    '_contrib_SparseEmbedding': (0,),
    '_contrib_boolean_mask': (1,),
    '_contrib_index_copy': (1,),
    '_ravel_multi_index': (0,),
    '_scatter_set_nd': (2,),
    '_sparse_retain': (1,),
    '_unravel_index': (0,),
    'batch_take': (1,),
    # broadcast_like/reshape_like/slice_like read their second input for its shape only.
    'broadcast_like': (1,),
    'gather_nd': (1,),
    'one_hot': (0,),
    'pick': (1,),
    'reshape_like': (1,),
    'scatter_nd': (1,),
    'slice_like': (1,),
    # softmax(data, length) with use_length=True.
    'softmax': (1,),
    'take': (1,),
    # where(condition, x, y) (alias _sparse_where): condition is a mask; x and y are the
    # widest-type pair.
    'where': (0,),
}
