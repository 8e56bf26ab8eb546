"""Operator classes that are the same for the float16 and bfloat16 target dtypes (MXNet 1.9.1).
Data only.

An op is listed here when its class and group are the same for both target dtypes; the ops whose
class differs are in :mod:`mxmp._src.policy.ops_float16` and :mod:`mxmp._src.policy.ops_bfloat16` (one
entry each, with the evidence for that dtype), and :mod:`mxmp._src.policy.tables` merges this module
with one of them into the dtype's table (an op listed both here and in a dtype's module is an
error there). So adding an op that behaves alike in both dtypes is one edit, here.

Every operator name MXNet 1.9.1 registers (``mx.operator.get_all_registered_operators()``) is in
exactly one class of each merged table, or a rule in
``EXCLUDED_PREFIXES`` of ``tables.py`` excludes it
(tests/policy/test_op_coverage.py enforces it). Aliases are listed under each of their names; a Symbol's JSON
always names the canonical op. Where a group's reason differs between the dtypes, its legend gives
both (``float16:``, ``bfloat16:``); the sources are those named in ops_float16.py and
ops_bfloat16.py: NVIDIA's "Training with Mixed Precision" guide, Micikevicius et al., "Mixed
Precision Training", ICLR 2018, MXNet 1.9.1's sources, contrib.amp's lists (read for facts, not
imported) and runs of every op on CPU with the 1.9.1 wheel (``mxmp check-kernels``).
"""

# ------------------------------------------------------------------------------------------------
# LOW_PRECISION: Run in the target dtype: every float input is cast to it.
# The comment after each name is its group:
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
LOW_PRECISION = (
    'Convolution',                                 # gemm
    'FullyConnected',                              # gemm
    '_sparse_FullyConnected',                      # gemm (alias of FullyConnected)
)

# ------------------------------------------------------------------------------------------------
# FLOAT32: Compute in float32: low-precision float inputs are cast to float32. The safe default.
# The comment after each name is its group:
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
FLOAT32 = (
    'BatchNorm_v1',                                # norm
    'Cast',                                        # explicit-cast
    'Convolution_v1',                              # conv-variant
    'Crop',                                        # no-kernel
    'Custom',                                      # subgraph
    'GridGenerator',                               # no-kernel
    'GroupNorm',                                   # norm
    'IdentityAttachKLSparseReg',                   # elementwise-loss
    'InstanceNorm',                                # norm
    'L2Normalization',                             # norm
    'LayerNorm',                                   # norm
    'SoftmaxActivation',                           # softmax
    'SpatialTransformer',                          # no-kernel
    '_CachedOp',                                   # subgraph
    '_CachedOpThreadSafe',                         # subgraph
    '_CustomFunction',                             # subgraph
    '_Hypot',                                      # pow (alias of _hypot)
    '_HypotScalar',                                # pow (alias of _hypot_scalar)
    '_NDArray',                                    # subgraph
    '_Native',                                     # subgraph
    '_NoGradient',                                 # internal
    '_Power',                                      # pow (alias of _power)
    '_PowerScalar',                                # pow (alias of _power_scalar)
    '_RDivScalar',                                 # pow (alias of _rdiv_scalar)
    '_RPowerScalar',                               # pow (alias of _rpower_scalar)
    '_adamw_update',                               # optimizer
    '_arange',                                     # creation
    '_broadcast_backward',                         # internal
    '_cond',                                       # subgraph
    '_contrib_DeformableConvolution',              # conv-variant
    '_contrib_DeformablePSROIPooling',             # detection
    '_contrib_ModulatedDeformableConvolution',     # conv-variant
    '_contrib_MultiBoxDetection',                  # detection
    '_contrib_MultiBoxPrior',                      # detection
    '_contrib_MultiBoxTarget',                     # detection
    '_contrib_MultiProposal',                      # detection
    '_contrib_Proposal',                           # detection
    '_contrib_SyncBatchNorm',                      # norm
    '_contrib_allclose',                           # index-math
    '_contrib_arange_like',                        # index-out
    '_contrib_bipartite_matching',                 # detection
    '_contrib_box_decode',                         # detection
    '_contrib_box_encode',                         # detection
    '_contrib_box_iou',                            # detection
    '_contrib_box_nms',                            # detection
    '_contrib_box_non_maximum_suppression',        # detection (alias of _contrib_box_nms)
    '_contrib_calibrate_entropy',                  # quantization
    '_contrib_count_sketch',                       # spectral
    '_contrib_dequantize',                         # quantization
    '_contrib_dgl_adjacency',                      # graph-sparse
    '_contrib_dgl_csr_neighbor_non_uniform_sample', # graph-sparse
    '_contrib_dgl_csr_neighbor_uniform_sample',    # graph-sparse
    '_contrib_dgl_graph_compact',                  # graph-sparse
    '_contrib_dgl_subgraph',                       # graph-sparse
    '_contrib_edge_id',                            # graph-sparse
    '_contrib_fft',                                # spectral
    '_contrib_getnnz',                             # graph-sparse
    '_contrib_group_adagrad_update',               # optimizer
    '_contrib_hawkesll',                           # exp-log
    '_contrib_ifft',                               # spectral
    '_contrib_quadratic',                          # pow
    '_contrib_quantize',                           # quantization
    '_contrib_quantize_asym',                      # quantization
    '_contrib_quantize_v2',                        # quantization
    '_contrib_quantized_act',                      # quantization
    '_contrib_quantized_batch_norm',               # quantization
    '_contrib_quantized_concat',                   # quantization
    '_contrib_quantized_conv',                     # quantization
    '_contrib_quantized_elemwise_add',             # quantization
    '_contrib_quantized_elemwise_mul',             # quantization
    '_contrib_quantized_embedding',                # quantization
    '_contrib_quantized_flatten',                  # quantization
    '_contrib_quantized_fully_connected',          # quantization
    '_contrib_quantized_pooling',                  # quantization
    '_contrib_quantized_rnn',                      # quantization
    '_contrib_requantize',                         # quantization
    '_cvcopyMakeBorder',                           # image-io
    '_cvimdecode',                                 # image-io
    '_cvimread',                                   # image-io
    '_cvimresize',                                 # image-io
    '_eye',                                        # creation
    '_foreach',                                    # subgraph
    '_full',                                       # creation
    '_histogram',                                  # index-math
    '_hypot',                                      # pow
    '_hypot_scalar',                               # pow
    '_image_adjust_lighting',                      # image-io
    '_image_crop',                                 # image-io
    '_image_flip_left_right',                      # image-io
    '_image_flip_top_bottom',                      # image-io
    '_image_normalize',                            # image-io
    '_image_random_brightness',                    # image-io
    '_image_random_color_jitter',                  # image-io
    '_image_random_contrast',                      # image-io
    '_image_random_flip_left_right',               # image-io
    '_image_random_flip_top_bottom',               # image-io
    '_image_random_hue',                           # image-io
    '_image_random_lighting',                      # image-io
    '_image_random_saturation',                    # image-io
    '_image_resize',                               # image-io
    '_image_to_tensor',                            # image-io
    '_imdecode',                                   # image-io
    '_linalg_det',                                 # linalg
    '_linalg_extractdiag',                         # linalg
    '_linalg_extracttrian',                        # linalg
    '_linalg_gelqf',                               # linalg
    '_linalg_gemm',                                # linalg
    '_linalg_gemm2',                               # linalg
    '_linalg_inverse',                             # linalg
    '_linalg_makediag',                            # linalg
    '_linalg_maketrian',                           # linalg
    '_linalg_potrf',                               # linalg
    '_linalg_potri',                               # linalg
    '_linalg_slogdet',                             # linalg
    '_linalg_sumlogdiag',                          # linalg
    '_linalg_syevd',                               # linalg
    '_linalg_syrk',                                # linalg
    '_linalg_trmm',                                # linalg
    '_linalg_trsm',                                # linalg
    '_linspace',                                   # creation
    '_mp_adamw_update',                            # optimizer
    '_multi_adamw_update',                         # optimizer
    '_multi_lamb_update',                          # optimizer
    '_multi_mp_adamw_update',                      # optimizer
    '_multi_mp_lamb_update',                       # optimizer
    '_np_cumsum',                                  # reduce
    '_onehot_encode',                              # internal
    '_ones',                                       # creation
    '_power',                                      # pow
    '_power_scalar',                               # pow
    '_random_exponential',                         # creation
    '_random_gamma',                               # creation
    '_random_generalized_negative_binomial',       # creation
    '_random_negative_binomial',                   # creation
    '_random_normal',                              # creation
    '_random_pdf_dirichlet',                       # creation
    '_random_pdf_exponential',                     # creation
    '_random_pdf_gamma',                           # creation
    '_random_pdf_generalized_negative_binomial',   # creation
    '_random_pdf_negative_binomial',               # creation
    '_random_pdf_normal',                          # creation
    '_random_pdf_poisson',                         # creation
    '_random_pdf_uniform',                         # creation
    '_random_poisson',                             # creation
    '_random_randint',                             # creation
    '_random_uniform',                             # creation
    '_ravel_multi_index',                          # index-math
    '_rdiv_scalar',                                # pow
    '_rpower_scalar',                              # pow
    '_sample_exponential',                         # creation
    '_sample_gamma',                               # creation
    '_sample_generalized_negative_binomial',       # creation
    '_sample_multinomial',                         # creation
    '_sample_negative_binomial',                   # creation
    '_sample_normal',                              # creation
    '_sample_poisson',                             # creation
    '_sample_uniform',                             # creation
    '_sample_unique_zipfian',                      # creation
    '_set_value',                                  # internal
    '_sg_mkldnn_conv',                             # conv-variant
    '_sg_mkldnn_fully_connected',                  # conv-variant
    '_sg_mkldnn_selfatt_qk',                       # conv-variant
    '_sg_mkldnn_selfatt_valatt',                   # conv-variant
    '_sparse_adagrad_update',                      # optimizer
    '_sparse_adam_update',                         # optimizer (alias of adam_update)
    '_sparse_arccos',                              # trig (alias of arccos)
    '_sparse_arcsin',                              # trig (alias of arcsin)
    '_sparse_arctanh',                             # trig (alias of arctanh)
    '_sparse_cosh',                                # trig (alias of cosh)
    '_sparse_exp',                                 # exp-log (alias of exp)
    '_sparse_expm1',                               # exp-log (alias of expm1)
    '_sparse_ftrl_update',                         # optimizer (alias of ftrl_update)
    '_sparse_gamma',                               # exp-log (alias of gamma)
    '_sparse_gammaln',                             # exp-log (alias of gammaln)
    '_sparse_log',                                 # exp-log (alias of log)
    '_sparse_log10',                               # exp-log (alias of log10)
    '_sparse_log1p',                               # exp-log (alias of log1p)
    '_sparse_log2',                                # exp-log (alias of log2)
    '_sparse_mean',                                # reduce (alias of mean)
    '_sparse_norm',                                # reduce (alias of norm)
    '_sparse_retain',                              # graph-sparse
    '_sparse_rsqrt',                               # pow (alias of rsqrt)
    '_sparse_sgd_mom_update',                      # optimizer (alias of sgd_mom_update)
    '_sparse_sgd_update',                          # optimizer (alias of sgd_update)
    '_sparse_sinh',                                # trig (alias of sinh)
    '_sparse_sum',                                 # reduce (alias of sum)
    '_sparse_tan',                                 # trig (alias of tan)
    '_split_v2_backward',                          # internal
    '_square_sum',                                 # pow
    '_unravel_index',                              # index-math
    '_while_loop',                                 # subgraph
    '_zeros',                                      # creation
    '_zeros_without_dtype',                        # creation
    'adam_update',                                 # optimizer
    'all_finite',                                  # optimizer
    'arccos',                                      # trig
    'arcsin',                                      # trig
    'arctanh',                                     # trig
    'argmax',                                      # index-out
    'argmax_channel',                              # index-out
    'argmin',                                      # index-out
    'argsort',                                     # index-out
    'broadcast_hypot',                             # pow
    'broadcast_power',                             # pow
    'cast',                                        # explicit-cast (alias of Cast)
    'cosh',                                        # trig
    'cumsum',                                      # reduce (alias of _np_cumsum)
    'erfinv',                                      # exp-log
    'exp',                                         # exp-log
    'expm1',                                       # exp-log
    'fill_element_0index',                         # internal
    'ftml_update',                                 # optimizer
    'ftrl_update',                                 # optimizer
    'gamma',                                       # exp-log
    'gammaln',                                     # exp-log
    'khatri_rao',                                  # linalg
    'lamb_update_phase1',                          # optimizer
    'lamb_update_phase2',                          # optimizer
    'linalg_det',                                  # linalg (alias of _linalg_det)
    'linalg_extractdiag',                          # linalg (alias of _linalg_extractdiag)
    'linalg_extracttrian',                         # linalg (alias of _linalg_extracttrian)
    'linalg_gelqf',                                # linalg (alias of _linalg_gelqf)
    'linalg_gemm',                                 # linalg (alias of _linalg_gemm)
    'linalg_gemm2',                                # linalg (alias of _linalg_gemm2)
    'linalg_inverse',                              # linalg (alias of _linalg_inverse)
    'linalg_makediag',                             # linalg (alias of _linalg_makediag)
    'linalg_maketrian',                            # linalg (alias of _linalg_maketrian)
    'linalg_potrf',                                # linalg (alias of _linalg_potrf)
    'linalg_potri',                                # linalg (alias of _linalg_potri)
    'linalg_slogdet',                              # linalg (alias of _linalg_slogdet)
    'linalg_sumlogdiag',                           # linalg (alias of _linalg_sumlogdiag)
    'linalg_syrk',                                 # linalg (alias of _linalg_syrk)
    'linalg_trmm',                                 # linalg (alias of _linalg_trmm)
    'linalg_trsm',                                 # linalg (alias of _linalg_trsm)
    'log',                                         # exp-log
    'log10',                                       # exp-log
    'log1p',                                       # exp-log
    'log2',                                        # exp-log
    'log_softmax',                                 # softmax
    'mean',                                        # reduce
    'moments',                                     # norm
    'mp_lamb_update_phase1',                       # optimizer
    'mp_lamb_update_phase2',                       # optimizer
    'mp_nag_mom_update',                           # optimizer
    'mp_sgd_mom_update',                           # optimizer
    'mp_sgd_update',                               # optimizer
    'multi_all_finite',                            # optimizer
    'multi_lars',                                  # optimizer
    'multi_mp_sgd_mom_update',                     # optimizer
    'multi_mp_sgd_update',                         # optimizer
    'multi_sgd_mom_update',                        # optimizer
    'multi_sgd_update',                            # optimizer
    'multi_sum_sq',                                # optimizer
    'nag_mom_update',                              # optimizer
    'nanprod',                                     # reduce
    'nansum',                                      # reduce
    'norm',                                        # reduce
    'normal',                                      # creation (alias of _random_normal)
    'one_hot',                                     # index-math
    'preloaded_multi_mp_sgd_mom_update',           # optimizer
    'preloaded_multi_mp_sgd_update',               # optimizer
    'preloaded_multi_sgd_mom_update',              # optimizer
    'preloaded_multi_sgd_update',                  # optimizer
    'prod',                                        # reduce
    'random_exponential',                          # creation (alias of _random_exponential)
    'random_gamma',                                # creation (alias of _random_gamma)
    'random_generalized_negative_binomial',        # creation
    'random_negative_binomial',                    # creation (alias of _random_negative_binomial)
    'random_normal',                               # creation (alias of _random_normal)
    'random_pdf_dirichlet',                        # creation (alias of _random_pdf_dirichlet)
    'random_pdf_exponential',                      # creation (alias of _random_pdf_exponential)
    'random_pdf_gamma',                            # creation (alias of _random_pdf_gamma)
    'random_pdf_generalized_negative_binomial',    # creation
    'random_pdf_negative_binomial',                # creation
    'random_pdf_normal',                           # creation (alias of _random_pdf_normal)
    'random_pdf_poisson',                          # creation (alias of _random_pdf_poisson)
    'random_pdf_uniform',                          # creation (alias of _random_pdf_uniform)
    'random_poisson',                              # creation (alias of _random_poisson)
    'random_randint',                              # creation (alias of _random_randint)
    'random_uniform',                              # creation (alias of _random_uniform)
    'ravel_multi_index',                           # index-math (alias of _ravel_multi_index)
    'rcbrt',                                       # pow
    'reciprocal',                                  # pow
    'reset_arrays',                                # optimizer
    'rmsprop_update',                              # optimizer
    'rmspropalex_update',                          # optimizer
    'rsqrt',                                       # pow
    'sample_exponential',                          # creation (alias of _sample_exponential)
    'sample_gamma',                                # creation (alias of _sample_gamma)
    'sample_generalized_negative_binomial',        # creation
    'sample_multinomial',                          # creation (alias of _sample_multinomial)
    'sample_negative_binomial',                    # creation (alias of _sample_negative_binomial)
    'sample_normal',                               # creation (alias of _sample_normal)
    'sample_poisson',                              # creation (alias of _sample_poisson)
    'sample_uniform',                              # creation (alias of _sample_uniform)
    'sgd_mom_update',                              # optimizer
    'sgd_update',                                  # optimizer
    'signsgd_update',                              # optimizer
    'signum_update',                               # optimizer
    'sinh',                                        # trig
    'smooth_l1',                                   # elementwise-loss
    'softmax',                                     # softmax
    'softmin',                                     # softmax
    'sort',                                        # no-kernel
    'sum',                                         # reduce
    'sum_axis',                                    # reduce (alias of sum)
    'tan',                                         # trig
    'topk',                                        # index-out
    'uniform',                                     # creation (alias of _random_uniform)
    'unravel_index',                               # index-math (alias of _unravel_index)
)

# ------------------------------------------------------------------------------------------------
# LOSS_OUTPUT: Loss heads: treated as FLOAT32; listed apart so the Module can scale the loss.
# The comment after each name is its group:
#   loss-head: loss heads: computed in float32; the Module puts the loss-scale node in front of
#       them.
LOSS_OUTPUT = (
    'CTCLoss',                                     # loss-head
    'LinearRegressionOutput',                      # loss-head
    'LogisticRegressionOutput',                    # loss-head
    'MAERegressionOutput',                         # loss-head
    'MakeLoss',                                    # loss-head
    'SVMOutput',                                   # loss-head
    'Softmax',                                     # loss-head (alias of SoftmaxOutput)
    'SoftmaxOutput',                               # loss-head
    '_contrib_CTCLoss',                            # loss-head (alias of CTCLoss)
    '_contrib_ctc_loss',                           # loss-head (alias of CTCLoss)
    '_sparse_LinearRegressionOutput',              # loss-head (alias of LinearRegressionOutput)
    '_sparse_LogisticRegressionOutput',            # loss-head (alias of LogisticRegressionOutput)
    '_sparse_MAERegressionOutput',                 # loss-head (alias of MAERegressionOutput)
    '_sparse_make_loss',                           # loss-head (alias of make_loss)
    'ctc_loss',                                    # loss-head (alias of CTCLoss)
    'make_loss',                                   # loss-head
    'softmax_cross_entropy',                       # loss-head
)

# ------------------------------------------------------------------------------------------------
# WIDEST_TYPE: Several float inputs that MXNet requires in one dtype: all cast to the widest.
# The comment after each name is its group:
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
WIDEST_TYPE = (
    'Concat',                                      # join
    'ElementWiseSum',                              # join (alias of add_n)
    'LeakyReLU',                                   # leaky-relu
    '_Div',                                        # binary (alias of elemwise_div)
    '_Equal',                                      # binary (alias of _equal)
    '_Greater',                                    # binary (alias of _greater)
    '_Greater_Equal',                              # binary (alias of _greater_equal)
    '_Lesser',                                     # binary (alias of _lesser)
    '_Lesser_Equal',                               # binary (alias of _lesser_equal)
    '_Logical_And',                                # binary (alias of _logical_and)
    '_Logical_Or',                                 # binary (alias of _logical_or)
    '_Logical_Xor',                                # binary (alias of _logical_xor)
    '_Maximum',                                    # binary (alias of _maximum)
    '_Minimum',                                    # binary (alias of _minimum)
    '_Minus',                                      # binary (alias of elemwise_sub)
    '_Mul',                                        # binary (alias of elemwise_mul)
    '_Not_Equal',                                  # binary (alias of _not_equal)
    '_Plus',                                       # binary (alias of elemwise_add)
    '_add',                                        # binary (alias of elemwise_add)
    '_contrib_index_copy',                         # join
    '_crop_assign',                                # join (alias of _slice_assign)
    '_div',                                        # binary (alias of elemwise_div)
    '_equal',                                      # binary
    '_greater',                                    # binary
    '_greater_equal',                              # binary
    '_identity_with_attr_like_rhs',                # binary
    '_lesser',                                     # binary
    '_lesser_equal',                               # binary
    '_logical_and',                                # binary
    '_logical_or',                                 # binary
    '_logical_xor',                                # binary
    '_maximum',                                    # binary
    '_minimum',                                    # binary
    '_minus',                                      # binary (alias of elemwise_sub)
    '_mul',                                        # binary (alias of elemwise_mul)
    '_not_equal',                                  # binary
    '_plus',                                       # binary (alias of elemwise_add)
    '_rnn_param_concat',                           # join
    '_scatter_elemwise_div',                       # binary
    '_slice_assign',                               # join
    '_sparse_ElementWiseSum',                      # join (alias of add_n)
    '_sparse_add_n',                               # join (alias of add_n)
    '_sparse_broadcast_add',                       # binary (alias of broadcast_add)
    '_sparse_broadcast_minus',                     # binary (alias of broadcast_sub)
    '_sparse_broadcast_plus',                      # binary (alias of broadcast_add)
    '_sparse_broadcast_sub',                       # binary (alias of broadcast_sub)
    '_sparse_concat',                              # join (alias of Concat)
    '_sparse_elemwise_add',                        # binary (alias of elemwise_add)
    '_sparse_elemwise_div',                        # binary (alias of elemwise_div)
    '_sparse_elemwise_mul',                        # binary (alias of elemwise_mul)
    '_sparse_elemwise_sub',                        # binary (alias of elemwise_sub)
    '_sparse_where',                               # join (alias of where)
    '_sub',                                        # binary (alias of elemwise_sub)
    'add_n',                                       # join
    'broadcast_add',                               # binary
    'broadcast_equal',                             # binary
    'broadcast_greater',                           # binary
    'broadcast_greater_equal',                     # binary
    'broadcast_lesser',                            # binary
    'broadcast_lesser_equal',                      # binary
    'broadcast_logical_and',                       # binary
    'broadcast_logical_or',                        # binary
    'broadcast_logical_xor',                       # binary
    'broadcast_maximum',                           # binary
    'broadcast_minimum',                           # binary
    'broadcast_minus',                             # binary (alias of broadcast_sub)
    'broadcast_not_equal',                         # binary
    'broadcast_plus',                              # binary (alias of broadcast_add)
    'broadcast_sub',                               # binary
    'concat',                                      # join (alias of Concat)
    'elemwise_add',                                # binary
    'elemwise_div',                                # binary
    'elemwise_mul',                                # binary
    'elemwise_sub',                                # binary
    'stack',                                       # join
    'where',                                       # join
)

# ------------------------------------------------------------------------------------------------
# FOLLOW: Keep their input's dtype (treated like WIDEST_TYPE; they never cast down).
# The comment after each name is its group:
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
FOLLOW = (
    'Activation',                                  # activation
    'BatchNorm',                                   # batchnorm
    'BlockGrad',                                   # identity
    'Embedding',                                   # gather
    'Flatten',                                     # shape
    'Pooling',                                     # pooling
    'Reshape',                                     # shape
    'SequenceLast',                                # gather
    'SequenceMask',                                # gather
    'SequenceReverse',                             # gather
    'SliceChannel',                                # shape
    'SwapAxis',                                    # shape
    '_DivScalar',                                  # math (alias of _div_scalar)
    '_EqualScalar',                                # math (alias of _equal_scalar)
    '_GreaterEqualScalar',                         # math (alias of _greater_equal_scalar)
    '_GreaterScalar',                              # math (alias of _greater_scalar)
    '_LesserEqualScalar',                          # math (alias of _lesser_equal_scalar)
    '_LesserScalar',                               # math (alias of _lesser_scalar)
    '_LogicalAndScalar',                           # math (alias of _logical_and_scalar)
    '_LogicalOrScalar',                            # math (alias of _logical_or_scalar)
    '_LogicalXorScalar',                           # math (alias of _logical_xor_scalar)
    '_MaximumScalar',                              # math (alias of _maximum_scalar)
    '_MinimumScalar',                              # math (alias of _minimum_scalar)
    '_MinusScalar',                                # math (alias of _minus_scalar)
    '_MulScalar',                                  # math (alias of _mul_scalar)
    '_NotEqualScalar',                             # math (alias of _not_equal_scalar)
    '_RMinusScalar',                               # math (alias of _rminus_scalar)
    '_contrib_div_sqrt_dim',                       # math
    '_contrib_gradientmultiplier',                 # identity
    '_contrib_index_array',                        # shape
    '_contrib_round_ste',                          # activation
    '_contrib_sign_ste',                           # activation
    '_copy',                                       # identity
    '_crop_assign_scalar',                         # shape (alias of _slice_assign_scalar)
    '_div_scalar',                                 # math
    '_equal_scalar',                               # math
    '_greater_equal_scalar',                       # math
    '_greater_scalar',                             # math
    '_lesser_equal_scalar',                        # math
    '_lesser_scalar',                              # math
    '_logical_and_scalar',                         # math
    '_logical_or_scalar',                          # math
    '_logical_xor_scalar',                         # math
    '_maximum_scalar',                             # math
    '_minimum_scalar',                             # math
    '_minus_scalar',                               # math
    '_mul_scalar',                                 # math
    '_not_equal_scalar',                           # math
    '_rminus_scalar',                              # math
    '_scatter_minus_scalar',                       # math
    '_scatter_plus_scalar',                        # math
    '_shuffle',                                    # shape
    '_slice_assign_scalar',                        # shape
    '_sparse_Embedding',                           # gather (alias of Embedding)
    '_sparse__contrib_round_ste',                  # activation (alias of _contrib_round_ste)
    '_sparse__contrib_sign_ste',                   # activation (alias of _contrib_sign_ste)
    '_sparse_abs',                                 # math (alias of abs)
    '_sparse_arccosh',                             # math (alias of arccosh)
    '_sparse_arcsinh',                             # math (alias of arcsinh)
    '_sparse_arctan',                              # math (alias of arctan)
    '_sparse_cast_storage',                        # shape (alias of cast_storage)
    '_sparse_cbrt',                                # math (alias of cbrt)
    '_sparse_ceil',                                # math (alias of ceil)
    '_sparse_clip',                                # math (alias of clip)
    '_sparse_cos',                                 # math (alias of cos)
    '_sparse_degrees',                             # math (alias of degrees)
    '_sparse_fix',                                 # math (alias of fix)
    '_sparse_floor',                               # math (alias of floor)
    '_sparse_negative',                            # math (alias of negative)
    '_sparse_radians',                             # math (alias of radians)
    '_sparse_relu',                                # activation (alias of relu)
    '_sparse_rint',                                # math (alias of rint)
    '_sparse_round',                               # math (alias of round)
    '_sparse_sigmoid',                             # activation (alias of sigmoid)
    '_sparse_sign',                                # math (alias of sign)
    '_sparse_sin',                                 # math (alias of sin)
    '_sparse_slice',                               # shape (alias of slice)
    '_sparse_sqrt',                                # math (alias of sqrt)
    '_sparse_stop_gradient',                       # identity (alias of BlockGrad)
    '_sparse_tanh',                                # activation (alias of tanh)
    '_sparse_trunc',                               # math (alias of trunc)
    '_sparse_zeros_like',                          # shape (alias of zeros_like)
    '_split_v2',                                   # shape
    'abs',                                         # math
    'arccosh',                                     # math
    'arcsinh',                                     # math
    'arctan',                                      # math
    'batch_take',                                  # gather
    'broadcast_axes',                              # shape (alias of broadcast_axis)
    'broadcast_axis',                              # shape
    'broadcast_like',                              # shape
    'broadcast_to',                                # shape
    'cast_storage',                                # shape
    'cbrt',                                        # math
    'ceil',                                        # math
    'choose_element_0index',                       # gather (alias of pick)
    'clip',                                        # math
    'cos',                                         # math
    'crop',                                        # shape (alias of slice)
    'degrees',                                     # math
    'depth_to_space',                              # shape
    'diag',                                        # shape
    'erf',                                         # math
    'expand_dims',                                 # shape
    'fix',                                         # math
    'flatten',                                     # shape (alias of Flatten)
    'flip',                                        # shape (alias of reverse)
    'floor',                                       # math
    'identity',                                    # identity (alias of _copy)
    'logical_not',                                 # math
    'max',                                         # math
    'max_axis',                                    # math (alias of max)
    'min',                                         # math
    'min_axis',                                    # math (alias of min)
    'negative',                                    # math
    'ones_like',                                   # shape
    'pick',                                        # gather
    'radians',                                     # math
    'relu',                                        # activation
    'repeat',                                      # shape
    'reshape',                                     # shape (alias of Reshape)
    'reshape_like',                                # shape
    'reverse',                                     # shape
    'rint',                                        # math
    'round',                                       # math
    'scatter_nd',                                  # gather
    'shape_array',                                 # shape
    'shuffle',                                     # shape (alias of _shuffle)
    'sigmoid',                                     # activation
    'sign',                                        # math
    'sin',                                         # math
    'size_array',                                  # shape
    'slice',                                       # shape
    'slice_axis',                                  # shape
    'slice_like',                                  # shape
    'softsign',                                    # activation
    'space_to_depth',                              # shape
    'split',                                       # shape (alias of SliceChannel)
    'sqrt',                                        # math
    'squeeze',                                     # shape
    'stop_gradient',                               # identity (alias of BlockGrad)
    'swapaxes',                                    # shape (alias of SwapAxis)
    'take',                                        # gather
    'tanh',                                        # activation
    'tile',                                        # shape
    'trunc',                                       # math
    'zeros_like',                                  # shape
)

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
    '_contrib_CTCLoss': (1, 2, 3),
    '_contrib_SparseEmbedding': (0,),
    '_contrib_boolean_mask': (1,),
    '_contrib_ctc_loss': (1, 2, 3),
    '_contrib_index_copy': (1,),
    '_ravel_multi_index': (0,),
    '_scatter_set_nd': (2,),
    '_sparse_Embedding': (0,),
    '_sparse_retain': (1,),
    # where(condition, x, y) (alias _sparse_where): condition is a mask; x and y are the
    # widest-type pair.
    '_sparse_where': (0,),
    '_unravel_index': (0,),
    'batch_take': (1,),
    # broadcast_like/reshape_like/slice_like read their second input for its shape only.
    'broadcast_like': (1,),
    'choose_element_0index': (1,),
    'ctc_loss': (1, 2, 3),
    'gather_nd': (1,),
    'one_hot': (0,),
    'pick': (1,),
    'ravel_multi_index': (0,),
    'reshape_like': (1,),
    'scatter_nd': (1,),
    'slice_like': (1,),
    # softmax(data, length) with use_length=True.
    'softmax': (1,),
    'take': (1,),
    'unravel_index': (0,),
    'where': (0,),
}
