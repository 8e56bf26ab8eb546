"""Operator classes for the bfloat16 target dtype that differ from float16's (MXNet 1.9.1 with
oneDNN). Data only.

The bfloat16 table is :mod:`mxmp._src.policy.ops_shared` (the ops whose class is the same for both
target dtypes) plus this module, which holds only the ops whose bfloat16 class differs from their
float16 class, and the bfloat16-only rules (CONDITIONAL_FLOAT32, FLOAT32_INPUTS of
_contrib_BatchNormWithReLU); :mod:`mxmp._src.policy.tables` merges the two and refuses an op
listed in both. Together they put every operator name MXNet 1.9.1 registers
(``mx.operator.get_all_registered_operators()``) in exactly one of LOW_PRECISION, FLOAT32,
LOSS_OUTPUT, WIDEST_TYPE, FOLLOW, or a rule in ``EXCLUDED_PREFIXES`` of ``tables.py`` excludes it.
Each class is ``{group: (op, ...)}``, with the evidence of each group in the legend above it.
Aliases are not listed: ``tables.py`` gives each its canonical op's class and entries, from
MXNet's registry; a Symbol's JSON always names the canonical op.

Where the facts come from:

- Which ops gain from low precision and which need float32: NVIDIA, "Training with Mixed
  Precision" and Micikevicius et al., "Mixed Precision Training", ICLR 2018. bfloat16 keeps
  float32's exponent range (no overflow, loss scaling off by default) but has only 8 significant
  bits, so reductions, exponentials, softmax and normalization statistics stay float32.
- Which ops have a bfloat16 kernel in 1.9.1: contrib.amp's lists
  (mxnet/contrib/amp/lists/symbol_bf16.py: BF16_FUNCS, BF16_FP32_FUNCS, BF16_USE_FP32_PARAMS; read
  for facts, not imported), the oneDNN sources (src/operator/nn/mkldnn/), BatchNormType in
  src/operator/nn/batch_norm.cc, and runs of every op with bfloat16 inputs on CPU with the 1.9.1
  wheel (tests/policy/test_op_coverage.py runs the FOLLOW and WIDEST_TYPE ops). Generic bfloat16
  kernels (elementwise, shape, gather ops) run anywhere; oneDNN bfloat16 kernels (Convolution,
  Deconvolution, FullyConnected, Activation, Pooling, LRN, BatchNorm) need avx512_bf16/AMX and
  fail on an AVX2-only CPU with "could not create a primitive descriptor iterator", which shows
  that the oneDNN path is taken.
- Which kernels are correct: real-kernel evidence. An op computes in bfloat16 only where it was
  measured sound on a CPU with oneDNN's bfloat16 kernels: ``mxmp check-kernels`` (the conformance
  suite, mxmp/conformance/) on a 2-core AMD EPYC (Zen 4) with avx512_bf16, MXNet 1.9.1,
  2026-11-23, runs every LOW_PRECISION, FOLLOW and WIDEST_TYPE op as a one-op graph at
  realistic sizes (NCHW (4, 32, 16, 16), (batch, time, feature) (8, 32, 64)), forward and
  backward, in its own process, against float32 on the same bfloat16-rounded inputs, with
  bfloat16 inputs and with float32 inputs the pass casts, seeds 0, 1, 2. Every op left in those
  three classes passed (relative max-norm error <= 2^-7 forward, <= 2^-6 backward); the ops it
  caught are FLOAT32 in the groups bf16-crash, bf16-inexact, bf16-mod and untested, and
  gather_nd in no-kernel, each with its measured figures. The same run with
  DNNL_MAX_CPU_ISA=AVX2 (generic kernels, oneDNN ops emulated) caught the same ops: these
  faults reproduce on AVX2 CPUs too (Deconvolution with cast inputs crashes there before oneDNN
  reports its missing kernel). docs/conformance.md has both tables. The ops `mxmp check-kernels`
  measured correct on the same CPU at the same sizes (forward <= 0.0032, backward <= 0.005) agree:
  SwapAxis, Reshape, Flatten, expand_dims, SliceChannel, slice, slice_axis, Concat, stack,
  add_n, elemwise_add/mul, broadcast_add, _mul_scalar, _plus_scalar (FLOAT32 nevertheless, see
  absorb), _div_scalar, relu, Activation (relu/sigmoid/tanh), sigmoid, tanh, LeakyReLU (leaky,
  gelu), clip, Pooling (max, avg, global avg), BatchNorm, depth_to_space, tile, repeat,
  broadcast_to, abs, square, negative, Embedding, take, where, _copy, BlockGrad, Convolution
  (dense and depthwise), FullyConnected.
- Differences from contrib.amp: the shape, gather and elementwise ops it casts to float32 in
  bfloat16 mode run in bfloat16 (checked) and FOLLOW here, saving casts; RNN, dot and batch_dot
  have no bfloat16 kernel in 1.9.1 and are FLOAT32; Deconvolution is FLOAT32 (bf16-crash).
"""

# ------------------------------------------------------------------------------------------------
# FLOAT32: Compute in float32: low-precision float inputs are cast to float32. The safe default.
# Its groups, the keys of the dict:
#   no-kernel: no bfloat16 kernel in MXNet 1.9.1, measured on CPU: their kernels switch over
#       float32/float64/float16 only ("Unknown type enum 12"), accept float32 only (dot and
#       batch_dot: float16 on GPU only; the interleaved attention matmuls: "Only FP32 is supported
#       on CPU") or reject bfloat16 in type inference. This includes RNN, Dropout, Pad, UpSampling,
#       the samplers and the ROI ops; contrib.amp also keeps RNN, Dropout and Pad float32 for
#       bfloat16. gather_nd's forward runs but its backward has no bfloat16 kernel ("Unknown type
#       enum 12", `mxmp check-kernels`, real kernels and AVX2 alike).
#   bf16-crash: the bfloat16 kernel crashes in MXNet 1.9.1 (`mxmp check-kernels`, each op in its own
#       process, avx512_bf16 and DNNL_MAX_CPU_ISA=AVX2 alike). transpose corrupts the heap: (4, 32,
#       16, 16) axes (0, 2, 1, 3) and (8, 32, 64) axes (0, 2, 1) abort with glibc "double free or
#       corruption (out)", "corrupted double-linked list", "corrupted size vs. prev_size" (or hang
#       in the corrupted allocator) when the data arrives in bfloat16, and give relative errors of
#       1.3-1.6 when the pass casts float32 data (a transformer block that splits heads with
#       transpose gave 0.53 against float32). Deconvolution (kernel 2x2, stride 2, 16
#       filters on (4, 32, 16, 16)) forward then backward dies with SIGSEGV ("Segmentation fault:
#       11") or hangs, in both cases, in every run; one run also died with "vector::reserve"; called
#       directly on bfloat16 arrays it ran, in a converted graph it does not. The fault is not
#       bfloat16's: a float32 Deconvolution whose weight is computed by another node (`w * 1.0`, or
#       `amp_cast(w, dtype='float32')`, which is what the pass inserts) segfaults in training too, 3
#       runs of 3, also with MXNET_SUBGRAPH_BACKEND=NONE and DNNL_MAX_CPU_ISA=AVX2; with the weight
#       a graph input it runs (docs/conformance.md has the script). As FLOAT32 the pass leaves its
#       weight a graph input.
#   bf16-inexact: the bfloat16 kernel runs but misses the tolerance (`mxmp check-kernels`, relative
#       max-norm error over seeds 0-2, tolerance 2^-7 forward, 2^-6 backward; identical with
#       DNNL_MAX_CPU_ISA=AVX2, so MXNet's generic kernels accumulate in bfloat16):
#       _contrib_AdaptiveAvgPooling2D (4x4 output) forward 0.0295; _contrib_BilinearResize2D (16 ->
#       32) forward 0.0200, backward 0.0429; broadcast_mul and broadcast_div of (4, 32, 16, 16) by
#       (1, 32, 1, 1) backward 0.0167 and 0.0213 (the gradient of the broadcast input sums 1024
#       products in bfloat16; forward 0.0059 and 0.0049 are fine); _grad_add forward 0.68 when the
#       pass casts its float32 inputs (0.0047 with bfloat16 inputs). broadcast_add/sub (backward <=
#       0.0082) stay WIDEST_TYPE.
#   bf16-mod: modulo in bfloat16 (`mxmp check-kernels`): the gradients are wrong (relative error 1.0
#       for _mod, broadcast_mod, _mod_scalar, _rmod_scalar) and x % 0.7 computes x % 0.69921875 (the
#       scalar rounded to bfloat16): forward error 0.999 at the discontinuities.
#   absorb: adding a scalar, x + c, in bfloat16 keeps only the bits of x above 2^-8 |c|. In
#       hard-swish and hard-sigmoid (x * clip(x + 3, 0, 6) / 6: GluonCV's HardSwish, HardSigmoid;
#       MobileNetV3) this made GluonCV mobilenetv3_small's logits 4-5x less accurate than
#       contrib.amp's: relative error 0.0522/0.0430/0.0401 (seeds 0/1/2) with _plus_scalar in
#       bfloat16, 0.0100/0.0087/0.0118 with it in float32, the same as contrib.amp (`python
#       benchmarks/hard_swish.py`, avx512_bf16). With _plus_scalar in float32 the clip,
#       division and multiply that follow it run in float32 too; the graph has 132 casts instead of
#       104, and a batch of 4 224x224 images runs in 342-459 ms instead of 1599-1732 ms on one
#       thread (MXNet's generic bfloat16 elementwise kernels are slow), so float32 wins on both
#       counts. The kernel itself is exact (`mxmp check-kernels`: forward error 0.0034, the output
#       rounding).
#   untested: no real-kernel evidence, so float32: `mxmp check-kernels` cannot build a sound one-op
#       case for them. _CrossDeviceCopy is inserted by the executor between devices; _copyto
#       registers no type inference; _scatter_set_nd is the in-place op of NDArray.__setitem__ (a
#       bound executor fails "inputs[0].dptr_ == outputs[0].dptr_"); _contrib_boolean_mask has a
#       data-dependent output shape; _contrib_SparseEmbedding's forward matched float32 exactly, its
#       backward needs a row_sparse gradient the suite does not bind.
FLOAT32 = {
    'no-kernel': ('BilinearSampler', 'Correlation', 'Dropout', 'Pad', 'Pooling_v1', 'RNN',
                  'ROIPooling', 'UpSampling', '_contrib_PSROIPooling', '_contrib_ROIAlign',
                  '_contrib_RROIAlign', '_contrib_interleaved_matmul_encdec_qk',
                  '_contrib_interleaved_matmul_encdec_valatt',
                  '_contrib_interleaved_matmul_selfatt_qk',
                  '_contrib_interleaved_matmul_selfatt_valatt', '_random_exponential_like',
                  '_random_gamma_like', '_random_generalized_negative_binomial_like',
                  '_random_negative_binomial_like', '_random_normal_like', '_random_poisson_like',
                  '_random_uniform_like', 'batch_dot', 'col2im', 'dot', 'gather_nd', 'hard_sigmoid',
                  'im2col'),
    'bf16-crash': ('Deconvolution', 'transpose'),
    'bf16-inexact': ('_contrib_AdaptiveAvgPooling2D', '_contrib_BilinearResize2D', '_grad_add',
                     'broadcast_div', 'broadcast_mul'),
    'bf16-mod': ('_mod', '_mod_scalar', '_rmod_scalar', 'broadcast_mod'),
    'absorb': ('_plus_scalar',),
    'untested': ('_CrossDeviceCopy', '_contrib_SparseEmbedding', '_contrib_boolean_mask', '_copyto',
                 '_scatter_set_nd'),
}

# ------------------------------------------------------------------------------------------------
# FOLLOW: Keep their input's dtype (treated like WIDEST_TYPE; they never cast down).
# Its groups, the keys of the dict:
#   batchnorm: BatchNorm and _contrib_BatchNormWithReLU: bfloat16 data, float32 gamma/beta/moving
#       stats (FLOAT32_INPUTS); BatchNormType in src/operator/nn/batch_norm.cc infers float32
#       parameters for bfloat16 data and oneDNN computes the statistics in float32 (contrib.amp
#       BF16_FP32_FUNCS and BF16_USE_FP32_PARAMS).
#   pooling: Pooling max/avg and LRN: oneDNN bfloat16 kernels (contrib.amp BF16_FP32_FUNCS); sum/lp
#       pooling have none and are float32 by CONDITIONAL_FLOAT32. Adaptive average pooling and
#       bilinear resize are bf16-inexact.
#   math: pointwise math, scalar arithmetic, comparisons and max/min (no accumulation); bfloat16
#       kernels checked on CPU (abs, clip, sqrt, square also in contrib.amp BF16_FP32_FUNCS).
FOLLOW = {
    'batchnorm': ('_contrib_BatchNormWithReLU',),
    'pooling': ('LRN',),
    'math': ('square',),
}

# ------------------------------------------------------------------------------------------------
# CONDITIONAL_FLOAT32: (op, attr, values): the op is FLOAT32 when attr has one of the values.
CONDITIONAL_FLOAT32 = (
    # softrelu = log(1 + exp(x)) (contrib.amp CONDITIONAL_FP32_FUNCS); softsign has no oneDNN
    # or generic bfloat16 kernel ("Unknown type enum 12", measured).
    ('Activation', 'act_type', ('softrelu', 'softsign')),
    # elu/selu evaluate exp(x) - 1 (contrib.amp); prelu/rrelu (and selu) have no bfloat16 kernel:
    # only leaky, elu and gelu take the oneDNN path (measured).
    ('LeakyReLU', 'act_type', ('elu', 'prelu', 'rrelu', 'selu')),
    # oneDNN pools max and avg only; sum and lp pooling have no bfloat16 kernel (measured).
    ('Pooling', 'pool_type', ('lp', 'sum')),
)

# FLOAT32_INPUTS: input positions that stay float32 when the op runs in bfloat16 (BatchNorm's are
# in ops_shared.py).
FLOAT32_INPUTS = {
    # gamma, beta, moving_mean, moving_var, as BatchNorm's: float32 parameters for bfloat16 data
    # (contrib.amp BF16_USE_FP32_PARAMS).
    '_contrib_BatchNormWithReLU': (1, 2, 3, 4),
}
