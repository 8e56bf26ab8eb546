"""The benchmark's modes, phases and fixed settings, and the label of a mode in the tables.

Shared by the parent (:mod:`benchmarks.runner`, the tables, the chart) and the worker process
(:mod:`benchmarks.worker`). The modes are described in ``scripts/benchmark.py``.
"""

MODELS = ('resnet50_v1', 'resnet18_v1', 'mobilenetv2_1.0')
#: BERT sentence classifiers (benchmarks.bert; GluonNLP 0.10, the optional extra ``bert``).
BERT_MODEL_NAMES = ('bert_base', 'bert_tiny')
#: Encoder-decoder transformers (benchmarks.transformer; GluonNLP 0.10, the same extra).
TRANSFORMER_MODEL_NAMES = ('transformer_nmt', 'transformer_tiny')
#: Mode name -> (label, phases it applies to). Order = order of the rows and of the interleaving.
MODES = {
    'float32': ('float32', ('train', 'infer')),
    'float32_mxmp_kernels': ("float32, mxmp's kernels", ('train', 'infer')),
    'float32_fused': ('float32, oneDNN-fused', ('infer',)),
    'float32_grad_null': ("float32, grad_req='null'", ('infer',)),
    'contrib_amp': ('contrib.amp {dtype}', ('train', 'infer')),
    'contrib_amp_cast_params': ('contrib.amp {dtype}, cast_optional_params', ('infer',)),
    'contrib_amp_fp32_attention': ('contrib.amp {dtype}, attention and Dropout in float32',
                                   ('train', 'infer')),
    'mxmp': ('mxmp {dtype}', ('train', 'infer')),
    'mxmp_cast_params': ('mxmp {dtype}, cast_params', ('train', 'infer')),
    'mxmp_unfused': ('mxmp {dtype}, fuse_inference=False', ('infer',)),
    'mxmp_cast_params_unfused': ('mxmp {dtype}, cast_params, fuse_inference=False', ('infer',)),
    'mxmp_mxnet_kernels': ("mxmp {dtype}, MXNet's kernels only", ('train', 'infer')),
    'mxmp_mxnet_fold': ('mxmp {dtype}, fold_batchnorm=False', ('infer',)),
    'mxmp_freeze': ('mxmp {dtype}, mxmp.freeze', ('infer',)),
    'mxmp_freeze_unfused': ('mxmp {dtype}, mxmp.freeze, fuse_inference=False', ('infer',)),
}
#: Modes run unless --modes says otherwise (the unfused modes, mxmp_mxnet_kernels and
#: mxmp_mxnet_fold measure levers, opt-in: oneDNN's fused FullyConnected keeps its own copy of
#: each weight; contrib_amp_fp32_attention is the workaround for GluonNLP's attention, BERT only;
#: float32_grad_null and the mxmp.freeze modes measure inference-only memory).
DEFAULT_MODES = [m for m in MODES if m not in ('mxmp_unfused', 'mxmp_cast_params_unfused',
                                               'contrib_amp_fp32_attention',
                                               'mxmp_mxnet_kernels', 'mxmp_mxnet_fold',
                                               'float32_mxmp_kernels',
                                               'float32_grad_null', 'mxmp_freeze',
                                               'mxmp_freeze_unfused')]
#: The same for the BERT models: contrib.amp as is (fails on GluonNLP's attention, reported as
#: a failed row) and with the attention matmuls kept in float32; no cast_params variants; float32
#: with mxmp's float32 rewrites (benchmarks.float32_kernels), the reference of what bfloat16
#: itself buys (CNNs: no op of theirs is rewritten, so the mode is opt-in there).
BERT_DEFAULT_MODES = ['float32', 'float32_mxmp_kernels', 'float32_fused', 'contrib_amp',
                      'contrib_amp_fp32_attention', 'mxmp']
#: The same for the encoder-decoder transformers: contrib.amp as is (its failure is a row).
TRANSFORMER_DEFAULT_MODES = ['float32', 'float32_mxmp_kernels', 'float32_fused', 'contrib_amp',
                             'mxmp']
#: Modes profiled by --profile, the first is the reference of the ratios.
PROFILE_MODES = ('float32', 'contrib_amp', 'mxmp')
BERT_PROFILE_MODES = ('float32', 'float32_mxmp_kernels', 'contrib_amp_fp32_attention', 'mxmp')
PHASES = ('train', 'infer')
#: The --quick configuration (explicit flags still win). cifar_resnet20_v1 (0.27 M parameters)
#: rather than resnet18_v1 (11.7 M): emulated cast_params runs cast every parameter to and from
#: bfloat16 several times per step, and MXNet's bfloat16 cast is slow on AVX2 CPUs, so
#: resnet18_v1 at 64x64 took 587 s here. One thread: on a shared 2-core machine two OpenMP
#: threads per process were ~9x slower than one (an emulated cifar_resnet20_v1 forward at load
#: 10: 553 ms vs 61 ms).
QUICK = dict(model='cifar_resnet20_v1', classes=10, input_size=32, batch_size=[8], warmup=1,
             iters=5, repeats=1, loss_steps=20, threads=1)
MIN_ITERS = 5
#: Tokens per sequence of the BERT models unless --seq-len says otherwise.
DEFAULT_SEQ_LEN = 128
#: Longest sentence of the encoder-decoder transformers unless --seq-len says otherwise.
DEFAULT_SENTENCE_LEN = 40
SEED = 0
LEARNING_RATE = 0.01
MOMENTUM = 0.9


class BenchmarkError(Exception):
    """Bad arguments or an unusable environment; the message names the fix."""



def mode_label(mode, dtype, emulated):
    """The row label of ``mode`` (str) for target dtype ``dtype`` (str), with " (emulated)"
    when ``emulated`` (bool) is true; an unknown mode is its own label."""
    label = MODES[mode][0].format(dtype=dtype) if mode in MODES else mode
    return label + (' (emulated)' if emulated else '')

