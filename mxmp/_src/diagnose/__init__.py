"""Per-layer numerics report: what a float32 network's tensors would do in float16 or bfloat16.

:func:`diagnose` runs a few float32 training iterations of a Gluon network and records, for
every layer that would compute in the target dtype, log2-magnitude histograms of four tensors:
its activations (output), its weights, its weight gradients and its activation gradients
(d loss / d output). From them it reports, for float16 and for bfloat16:

* the fraction of values that would **overflow** (|x| > 65504 in float16, > 3.39e38 in
  bfloat16: they become inf),
* the fraction that would become **subnormal** (float16: |x| < 2**-14, precision lost) or
  **flush to zero** (float16: |x| < 2**-24; bfloat16: |x| < 2**-126, because oneDNN's bfloat16
  kernels run with denormals flushed),
* the **loss scale** that keeps the gradients in range: the largest power of two ``S`` with
  ``max|gradient| * S <= max finite`` (capped at ``max_loss_scale``, 2**24 as mxmp's and
  contrib.amp's dynamic scalers), and the fraction of gradient values it rescues from
  flushing to zero,
* the layers it recommends keeping in float32, as node names ready for
  ``mxmp.Policy(target_dtype, excluded_names=report.excluded_names)``.

The thresholds are those of IEEE 754 binary16 and of bfloat16 (float32's 8-bit exponent with a
7-bit mantissa); the method and the gradient histogram plot follow Micikevicius et al., "Mixed
Precision Training", ICLR 2018 (section 3.2 and its activation-gradient histogram figure) and
NVIDIA's "Training With Mixed Precision" guide ("Choosing A Scaling Factor").

How the tensors are captured (MXNet 1.9.1). Gluon's forward hooks see the outputs of child
blocks but not their gradients, and they do not exist for a ``SymbolBlock`` loaded from files.
So the network is traced to a Symbol (``net(mx.sym.var('data'))``, which works for every
HybridBlock and SymbolBlock) and every reported node ``y`` is rewired through
``y + probe``, where ``probe`` is a new all-zero input variable: the forward values do not
change, and the gradient MXNet's executor computes for ``probe`` is exactly d loss / d ``y``,
the activation gradient. The graph is bound once (``Symbol.simple_bind``) with *copies* of the
network's parameters: the network itself is never modified. The loss is computed imperatively
from the executor's output with ``autograd`` (any ``loss_fn(output, label)`` works) and its
gradient fed to ``executor.backward``. Gradients are those of ``loss.backward()`` on the
per-sample loss (summed over the batch), as in a training loop before the optimizer's
``rescale_grad``. Between iterations the copies take one plain SGD step
(``w -= learning_rate * grad / batch_size``) so that the statistics are not those of one point.

Which nodes are "layers": the nodes that :func:`mxmp.explain` says compute in the target dtype
(Convolution, FullyConnected, and the follow / widest-type ops between them: BatchNorm, relu,
add, pooling...). Nodes the pass keeps in float32 (softmax, LayerNorm, losses...) are not
reported: their tensors never exist in low precision. Their weights are the node's inputs that
are parameters, except BatchNorm's gamma/beta/moving statistics, which stay float32.
Fractions are of the finite non-zero values (exact zeros, such as ReLU's, are representable).

Where things are: :mod:`.capture` (:func:`diagnose`: run the network, collect per-layer
tensors), :mod:`.stats` (number formats, histograms, verdicts), :mod:`.report`
(:class:`NumericsReport`, its table and JSON), :mod:`.inputs` (a saved graph and a RecordIO
batch as ``diagnose``'s inputs, for ``mxmp diagnose``). The charts are in
:mod:`mxmp._src.plotting.report_charts`.
"""
