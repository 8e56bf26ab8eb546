"""The benchmark behind ``scripts/benchmark.py`` (the entry point: flags and ``main``).

Speed, memory and cast counts of mxmp against float32 and ``mxnet.contrib.amp``.

Every measurement runs in its own fresh Python subprocess (``mxnet.contrib.amp.init()`` patches
MXNet for the rest of a process and cannot be undone; peak RSS is per process), with the same
``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` and ``MXNET_*`` environment for every mode. Modes run
interleaved (``float32, contrib.amp, mxmp, ..., float32, contrib.amp, mxmp, ...``) ``--repeats``
times, so slow drift of a shared machine hits every mode alike.

Modes (``--dtype`` is the target dtype, ``bfloat16`` by default):

* ``float32``: the GluonCV model as is, ``gluon.Trainer``.
* ``float32_fused`` (inference only): the same, ``hybridize(static_alloc=True,
  static_shape=True, backend='MKLDNN')``: oneDNN's fused graph, the fastest float32 inference a
  user can have; the float32 reference of the inference rows ("x fused float32").
* ``float32_mxmp_kernels`` (BERT and transformer models' default, else only when named):
  float32 with mxmp's float32 rewrites and nothing else (:mod:`benchmarks.float32_kernels`: the
  library's LayerNorm, softmax with lengths and Dropout, the reduction rule), ``gluon.Trainer``:
  the reference of what bfloat16 itself buys ("x float32 mxmp's kernels").
* ``contrib_amp``: ``mxnet.contrib.amp``. Training: ``amp.init(target_dtype)`` before the
  network is built, ``amp.init_trainer(trainer)``, ``amp.scale_loss`` inside
  ``autograd.record()``. Inference: ``amp.convert_hybrid_block(net, target_dtype, ctx=ctx)``
  (after one float32 forward, which it requires).
* ``contrib_amp_cast_params`` (inference only): the same with ``cast_optional_params=True``.
* ``contrib_amp_fp32_attention`` (BERT models' default, else only when named): ``contrib_amp``
  with GluonNLP's attention matmuls and Dropout kept in float32 (``amp.init(fp32_ops=...)``;
  for inference ``excluded_sym_names`` of those nodes), the workaround that lets contrib.amp run
  GluonNLP's BERT at all (:mod:`benchmarks.bert`).
* ``mxmp``: ``mxmp.convert(net, target_dtype, cast_params=False)`` + ``mxmp.Trainer``.
* ``mxmp_cast_params``: the same with ``cast_params=True`` (weights stored in the target dtype,
  float32 master weights in the Trainer). mxmp inference is fused by default where the kernels
  exist (``fuse_inference='auto'``; such rows are labelled "(fused)").
* ``mxmp_cast_params_unfused`` (inference only, run only when named): ``mxmp_cast_params`` with
  ``fuse_inference=False``: the least memory (oneDNN's fused FullyConnected keeps its own copy
  of each weight; docs/benchmark.md).
* ``mxmp_unfused`` (inference only, run only when named in ``--modes``): ``mxmp`` with
  ``fuse_inference=False``, to measure the fusion lever.
* ``mxmp_mxnet_kernels`` (run only when named): ``mxmp`` with ``Policy(kernels='mxnet')``, MXNet's
  own kernels where mxmp's operator library would run (LayerNorm), to measure that lever.
* ``mxmp_mxnet_fold`` (inference only, run only when named): ``mxmp`` with
  ``fold_batchnorm=False`` (MXNet folds BatchNorm into the fused convolutions itself).
* ``float32_grad_null`` (inference only, run only when named): ``float32`` with every
  Parameter's ``grad_req='null'`` (no gradient arrays): the float32 reference of an
  inference-only process.
* ``mxmp_freeze`` and ``mxmp_freeze_unfused`` (inference only, run only when named):
  ``mxmp.convert`` (``fuse_inference='auto'``, resp. False), hybridized like the others, then
  ``mxmp.freeze(net, *batch)``: the inference-only network with one array per weight (the
  conversion time includes the freeze and its first call).

The limit (:mod:`benchmarks.peak`, :mod:`benchmarks.flops`): once per repeat a process measures
the GEMM peak (``--gemm-size`` cubed, default 2048, float32 and the target dtype, same threads);
every row gets its forward FLOP per image, counted from the graph's Convolution and
FullyConnected layers with their inferred shapes, and its percent of the peak of its dtype
(training counted as 3x forward). ``--profile`` replaces the benchmark with a per-operator
training profile of float32, contrib.amp and mxmp side by side (:mod:`benchmarks.profile`).

The mxmp modes *emulate* the target dtype (float32 kernels, low-precision rounding; see
``mxmp/graph/convert.py``) when ``mxmp.lp_kernels_available(dtype, ctx)`` is False
(``--emulate auto``, the default). Emulated rows are labelled "(emulated)": they measure
numerics and the cost of
emulation, not the speed of low-precision kernels. A mode that fails (for example contrib.amp
bfloat16 on a CPU without AVX-512: "could not create a primitive descriptor iterator") is a row
with status ``failed`` and the first line of its error; a failed mode is not re-run in later
repeats (the failure is deterministic; the log of the first attempt is kept).

Per row (phase ``train`` or ``infer``, batch size, mode): throughput in images/s, sequences/s or sentences/s (median, min
and max over every timed iteration of every repeat; one iteration = forward [+ backward + update]
of one batch, synchronised with ``mx.nd.waitall()``), peak RSS of the subprocess in MiB
(``ru_maxrss`` of the child itself, largest over the repeats; the RSS after ``import mxnet``
and the model zoo is given too), the number of ``amp_cast`` and ``amp_multicast`` nodes in the
graph that runs (``mxmp.count_casts``, i.e. ``Symbol.tojson(remove_amp_cast=False)``; for
emulated rows also those of the real low-precision graph), the conversion time in seconds, and
throughput and memory ratios against float32 and against contrib.amp.

A separate subprocess checks training numerics: the loss after ``--loss-steps`` (20) SGD steps
on one fixed synthetic batch, float32 against mxmp (cast_params False and True), from the same
initial weights. Reported, not asserted.

Outputs in ``--output-dir`` (default ``runs/benchmark``): ``benchmark.json`` (everything),
``benchmark.md`` (the tables, also printed), ``benchmark.png`` (bar chart, one column per
phase that ran), ``logs/`` (stderr of every subprocess); with ``--profile``: ``profile.json``,
``profile.md`` and each mode's raw ``mx.profiler.dumps()`` table.

Modules, one job each:

* :mod:`benchmarks.modes` -- the modes, phases and fixed settings; a mode's label.
* :mod:`benchmarks.workloads` -- the network, inputs, labels and loss of a run: GluonCV image
  classifiers, the BERT classifiers of :mod:`benchmarks.bert` (``--model bert_base``;
  throughput in sequences/s), or the encoder-decoder transformers of
  :mod:`benchmarks.transformer` (``--model transformer_nmt``: GluonNLP's encoder and decoder,
  4+4 layers of model size 512, batches of sentence pairs of 8 to ``--seq-len`` (40) tokens;
  throughput in sentences/s).
* :mod:`benchmarks.runner` -- the parent side: worker environment, one worker process, every
  mode interleaved over the repeats.
* :mod:`benchmarks.worker` -- the worker side (``python -m benchmarks.worker``): one mode, one
  phase, one batch size in a fresh process.
* :mod:`benchmarks.stats` -- one row from the repeats (medians, min, max), ratios, loss check.
* :mod:`benchmarks.report` -- the Markdown tables.
* :mod:`benchmarks.charts` -- the bar chart (matplotlib).
* :mod:`benchmarks.flops` -- FLOP per image from a graph's Convolution/FullyConnected shapes.
* :mod:`benchmarks.peak` -- the GEMM peak of this machine (float32 and the target dtype) and
  the percent of it a row reaches.
* :mod:`benchmarks.profile` -- per-operator time from MXNet's profiler, side by side.
* :mod:`benchmarks.scaling` -- ``--threads 1 2``: the counts lined up; ``python -m
  benchmarks.scaling OUTPUT_DIR --project 8 16 32 64``: a profile projected to more cores
  (Amdahl's law per operator).
* :mod:`benchmarks.memory` -- peak RSS split into a fixed part and a part per image.
* :mod:`benchmarks.train_rss` -- peak RSS of a few training steps, one lever at a time.
* :mod:`benchmarks.rss_stages` -- resident memory after each stage of one run (any model,
  training or inference), with the bytes of weights, gradients, optimizer state and master
  weights.

Not part of the installed ``mxmp`` package.
"""
