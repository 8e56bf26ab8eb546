"""What a worker runs: the network, its inputs and labels, and how a sample is counted.

Two kinds, chosen by the ``--model`` name: GluonCV image classifiers (one input ``data``, a
batch of random images, samples are images) and the BERT classifiers of
:mod:`benchmarks.bert` (three inputs, a batch of random token ids, samples are sequences).
The worker (:mod:`benchmarks.worker`) calls only the methods below, so every mode runs the same
way on both.
"""
import numpy as np

from benchmarks import bert as bench_bert
from benchmarks.modes import SEED

__all__ = ['workload_for', 'is_bert', 'ImageWorkload', 'BertWorkload']


def is_bert(model):
    """Whether ``model`` (str) names a BERT model of :mod:`benchmarks.bert`."""
    return model in bench_bert.BERT_MODELS


def workload_for(spec):
    """The workload of a measurement ``spec`` (dict with ``model`` and its settings)."""
    return BertWorkload(spec) if is_bert(spec['model']) else ImageWorkload(spec)


class ImageWorkload:
    """A GluonCV model-zoo classifier on random images (``spec``: model, classes, input_size).

    Attributes:
        data_names (tuple of str): ``('data',)``.
        unit (str): ``'img'``.
    """
    data_names = ('data',)
    unit = 'img'

    def __init__(self, spec):
        self.spec = spec
        self.rng = np.random.RandomState(SEED)

    def versions(self):
        """{package: version} of the model's library."""
        import gluoncv
        return {'gluoncv': gluoncv.__version__}

    def model(self, dropout=None):  # pylint: disable=unused-argument  (CNNs: no dropout knob)
        """The network, not initialized."""
        from gluoncv.model_zoo import get_model
        return get_model(self.spec['model'], pretrained=False, classes=self.spec['classes'])

    def initialize(self, net, mx, ctx):
        """Initialize ``net``'s weights on ``ctx`` (Xavier, magnitude 2)."""
        net.initialize(mx.init.Xavier(magnitude=2), ctx=ctx)

    def inputs(self, mx, batch, ctx):
        """Tuple of the network's input NDArrays for ``batch`` samples."""
        size = self.spec['input_size']
        return (mx.nd.random.uniform(-1, 1, shape=(batch, 3, size, size), ctx=ctx),)

    def labels(self, mx, batch, ctx):
        """Class labels (float32, shape (batch,))."""
        return mx.nd.array(self.rng.randint(0, self.spec['classes'], size=batch), ctx=ctx)

    def sample_shapes(self):
        """{input name: shape of one sample} (for :func:`benchmarks.flops
        .forward_flops_per_image`)."""
        size = self.spec['input_size']
        return {'data': (3, size, size)}


class BertWorkload(ImageWorkload):
    """A BERT classifier of :mod:`benchmarks.bert` on random token ids (``spec``: model,
    seq_len).

    Attributes:
        data_names (tuple of str): :data:`benchmarks.bert.DATA_NAMES`.
        unit (str): ``'seq'``: throughput is in sequences per second.
    """
    data_names = bench_bert.DATA_NAMES
    unit = 'seq'

    def versions(self):
        import gluonnlp
        return {'gluonnlp': gluonnlp.__version__}

    def model(self, dropout=None):
        return bench_bert.build_bert(self.spec['model'], dropout=dropout)

    def initialize(self, net, mx, ctx):
        """Initialize ``net``'s weights on ``ctx`` (normal, sigma 0.02, as BERT's)."""
        net.initialize(mx.init.Normal(0.02), ctx=ctx)

    def inputs(self, mx, batch, ctx):
        return bench_bert.bert_inputs(mx, self.spec['model'], batch, self.spec['seq_len'], ctx,
                                      self.rng)

    def labels(self, mx, batch, ctx):
        return bench_bert.bert_labels(mx, batch, ctx, self.rng)

    def sample_shapes(self):
        length = self.spec['seq_len']
        return {'inputs': (length,), 'token_types': (length,), 'valid_length': ()}
