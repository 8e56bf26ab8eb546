"""What a worker runs: the network, its inputs and labels, and how a sample is counted.

Three kinds, chosen by the ``--model`` name: GluonCV image classifiers (one input ``data``, a
batch of random images, samples are images), the BERT classifiers of :mod:`benchmarks.bert`
(three inputs, a batch of random token ids, samples are sequences) and the encoder-decoder
transformers of :mod:`benchmarks.transformer` (four inputs, batches of sentence pairs of
varying length, samples are sentences). The worker (:mod:`benchmarks.worker`) calls only the
methods below, so every mode runs the same way on all three.
"""
import numpy as np

from benchmarks import bert as bench_bert
from benchmarks import flops as bench_flops
from benchmarks import transformer as bench_transformer
from benchmarks.modes import SEED

__all__ = ['workload_for', 'is_bert', 'is_transformer', 'is_text', 'unit_of', 'UNIT_NAMES',
           'shape_label', 'ImageWorkload', 'BertWorkload', 'TransformerWorkload']

#: unit of a throughput -> (plural, singular): images, sequences (BERT), sentences (the
#: encoder-decoder transformers).
UNIT_NAMES = {'img': ('images', 'image'), 'seq': ('sequences', 'sequence'),
              'sent': ('sentences', 'sentence')}


def is_bert(model):
    """Whether ``model`` (str) names a BERT model of :mod:`benchmarks.bert`."""
    return model in bench_bert.BERT_MODELS


def is_transformer(model):
    """Whether ``model`` (str) names an encoder-decoder of :mod:`benchmarks.transformer`."""
    return model in bench_transformer.TRANSFORMER_MODELS


def is_text(model):
    """Whether ``model`` (str) takes token ids (BERT or the encoder-decoders)."""
    return is_bert(model) or is_transformer(model)


def unit_of(model):
    """The throughput unit of ``model`` (a key of :data:`UNIT_NAMES`)."""
    return 'seq' if is_bert(model) else 'sent' if is_transformer(model) else 'img'


def shape_label(config):
    """What one sample of the run ``config`` (the report's config dict: ``model``, ``unit``,
    ``seq_len``, ``input_size``) is, for titles: ``'input 224x224'``, ``'sequence length
    128'`` or ``'sentence pairs of 8-40 tokens'``."""
    unit = config.get('unit') or 'img'
    if unit == 'seq':
        return 'sequence length %d' % config['seq_len']
    if unit == 'sent':
        return 'sentence pairs of %d-%d tokens' % (min(bench_transformer.MIN_LEN,
                                                       config['seq_len']), config['seq_len'])
    return 'input %dx%d' % (config['input_size'], config['input_size'])


def workload_for(spec):
    """The workload of a measurement ``spec`` (dict with ``model`` and its settings)."""
    if is_bert(spec['model']):
        return BertWorkload(spec)
    return TransformerWorkload(spec) if is_transformer(spec['model']) else ImageWorkload(spec)


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

    def batches(self, mx, batch, ctx):
        """The batches the timed iterations cycle through: a list of (tuple of input NDArrays,
        labels); here one, of :meth:`inputs` and :meth:`labels`."""
        return [(self.inputs(mx, batch, ctx), self.labels(mx, batch, ctx))]

    def tokens_per_sample(self, batches):  # pylint: disable=unused-argument
        """Valid target tokens per sample of ``batches`` (float), or None (no tokens)."""
        return None

    def loss(self, gluon):
        """``loss(output, labels)`` per sample: softmax cross-entropy."""
        return gluon.loss.SoftmaxCrossEntropyLoss()

    def flop_per_sample(self, sym):
        """Forward FLOP of one sample of graph ``sym`` (:mod:`benchmarks.flops`)."""
        return bench_flops.forward_flops_per_image(sym, self.sample_shapes())

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


class TransformerWorkload(ImageWorkload):
    """An encoder-decoder of :mod:`benchmarks.transformer` on batches of sentence pairs
    (``spec``: model, seq_len = the longest sentence).

    Attributes:
        data_names (tuple of str): :data:`benchmarks.transformer.DATA_NAMES`.
        unit (str): ``'sent'``: throughput is in sentences (pairs) per second.
    """
    data_names = bench_transformer.DATA_NAMES
    unit = 'sent'

    def versions(self):
        import gluonnlp
        return {'gluonnlp': gluonnlp.__version__}

    def model(self, dropout=None):
        return bench_transformer.build_transformer(self.spec['model'], dropout=dropout)

    def initialize(self, net, mx, ctx):
        """Xavier (uniform, fan average, magnitude 3), as GluonNLP's translation scripts."""
        net.initialize(mx.init.Xavier(rnd_type='uniform', factor_type='avg', magnitude=3),
                       ctx=ctx)

    def batches(self, mx, batch, ctx):
        """:data:`benchmarks.transformer.NUM_BATCHES` seeded batches of varying length."""
        return bench_transformer.sentence_batches(mx, self.spec['model'], batch,
                                                  self.spec['seq_len'], ctx, self.rng)

    def inputs(self, mx, batch, ctx):
        """The inputs of the first batch (the seeded batches drawn anew)."""
        return self._first(mx, batch, ctx)[0]

    def labels(self, mx, batch, ctx):
        """The labels of the first batch (the same batch as :meth:`inputs`)."""
        return self._first(mx, batch, ctx)[1]

    def _first(self, mx, batch, ctx):
        return bench_transformer.sentence_batches(mx, self.spec['model'], batch,
                                                  self.spec['seq_len'], ctx,
                                                  np.random.RandomState(SEED), count=1)[0]

    def tokens_per_sample(self, batches):
        return bench_transformer.tokens_per_sentence(batches)

    def loss(self, gluon):
        """Masked softmax cross-entropy over the valid target tokens."""
        return bench_transformer.masked_loss()

    def flop_per_sample(self, sym):
        """Forward FLOP per sentence pair, averaged over the batches the run cycles through
        (the same seed: the same padded lengths); padding is counted, the layers compute it."""
        import mxnet as mx
        batches = bench_transformer.sentence_batches(
            mx, self.spec['model'], self.spec['batch_size'], self.spec['seq_len'], mx.cpu(),
            np.random.RandomState(SEED))
        flop = [bench_flops.forward_flops_per_image(sym, {
            'src': (xs[0].shape[1],), 'tgt': (xs[1].shape[1],), 'src_valid_length': (),
            'tgt_valid_length': ()}) for xs, _ in batches]
        return int(round(float(np.mean(flop))))

    def sample_shapes(self):
        length = self.spec['seq_len']
        return {'src': (length,), 'tgt': (length,), 'src_valid_length': (),
                'tgt_valid_length': ()}
