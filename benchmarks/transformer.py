"""An encoder-decoder transformer in the benchmark: GluonNLP 0.10's ``TransformerEncoder`` and
``TransformerDecoder`` between a shared token embedding and an output layer tied to it, trained
on synthetic sentence pairs of varying length.

``transformer_nmt`` is the machine-translation shape of issue 28: model size 512, feed-forward
2048, 8 heads, 4 encoder + 4 decoder layers, dropout 0.1, over a 32,000-token vocabulary shared
by source and target (the size of common byte-pair vocabularies; its embedding is also the
output layer's weight, as in GluonNLP's ``transformer_en_de_512``). ``transformer_tiny`` (1 + 1
layers, 32 units, 2 heads, feed-forward 64, 1,000 tokens) runs the same code in seconds.

GluonNLP's ``NMTModel`` is a plain ``gluon.Block`` (its decoder state is made imperatively), so
it cannot be hybridized or given to ``mxmp.convert``: :class:`Seq2SeqTransformer` is the
HybridBlock that composes GluonNLP's hybridizable encoder and decoder instead, with the memory
mask computed in the graph. Its attention is GluonNLP's ``MultiHeadAttentionCell``
(``batch_dot`` + masked ``softmax``), not BERT's interleaved matmuls.

A batch (:func:`sentence_batches`) is ``batch`` sentence pairs whose source and target lengths
are drawn uniformly from ``min_len`` to ``max_len`` tokens (seeded), padded to the longest
sentence of the batch; the valid lengths mask the attention and the loss
(``gluonnlp.loss.MaskedSoftmaxCELoss``). The benchmark cycles through :data:`NUM_BATCHES` such
batches, so the shapes and masks change from one iteration to the next as in real training.
"""
import numpy as np

from benchmarks.modes import BenchmarkError

__all__ = ['TRANSFORMER_MODELS', 'DATA_NAMES', 'MIN_LEN', 'DEFAULT_MAX_LEN', 'NUM_BATCHES',
           'build_transformer', 'sentence_batches', 'masked_loss', 'tokens_per_sentence']

#: model name -> shape (layers: encoder layers = decoder layers).
TRANSFORMER_MODELS = {
    'transformer_nmt': dict(num_layers=4, units=512, hidden_size=2048, num_heads=8,
                            vocab_size=32000, dropout=0.1),
    'transformer_tiny': dict(num_layers=1, units=32, hidden_size=64, num_heads=2,
                             vocab_size=1000, dropout=0.1),
}
#: Inputs of :class:`Seq2SeqTransformer`, in call order: source and target token ids (float32,
#: batch x padded length) and their valid lengths (float32, batch).
DATA_NAMES = ('src', 'tgt', 'src_valid_length', 'tgt_valid_length')
#: Shortest sentence (tokens); the longest is ``--seq-len`` (default :data:`DEFAULT_MAX_LEN`).
MIN_LEN = 8
DEFAULT_MAX_LEN = 40
#: Longest sentence the positional encoding covers.
MAX_POSITIONS = 512
#: Distinct seeded batches the benchmark cycles through.
NUM_BATCHES = 4


def _gluonnlp():
    try:
        import gluonnlp
    except ImportError as err:
        raise BenchmarkError("the transformer models need GluonNLP 0.10: pip install -e "
                             "'.[bert]' (gluonnlp==0.10.0) (%s)" % err) from err
    return gluonnlp


def build_transformer(name, dropout=None):
    """The encoder-decoder of :data:`TRANSFORMER_MODELS` ``name``, uninitialized.

    Args:
        name (str): a key of :data:`TRANSFORMER_MODELS`.
        dropout (float or None): dropout of every layer; None: the model's own (0.1).

    Returns:
        Seq2SeqTransformer: ``net(src, tgt, src_valid_length, tgt_valid_length)`` returns
        float32 logits of shape (batch, target length, vocabulary). Initialize it with
        ``mx.init.Xavier(rnd_type='uniform', factor_type='avg', magnitude=3)``.

    Raises:
        BenchmarkError: unknown ``name`` or no GluonNLP.
    """
    if name not in TRANSFORMER_MODELS:
        raise BenchmarkError('unknown transformer model %r; use one of %s'
                             % (name, ', '.join(TRANSFORMER_MODELS)))
    shape = dict(TRANSFORMER_MODELS[name])
    if dropout is not None:
        shape['dropout'] = dropout
    return _model_class()(shape, prefix='seq2seq_')


def _model_class():
    """:class:`Seq2SeqTransformer`, defined at first use (it subclasses MXNet's HybridBlock and
    uses GluonNLP: importing this module needs neither)."""
    if _MODEL[0] is None:
        _gluonnlp()   # the install hint if GluonNLP is missing
        _MODEL[0] = _define_model()
    return _MODEL[0]


_MODEL = [None]


def _define_model():
    from mxnet.gluon import HybridBlock, nn
    from gluonnlp.model.transformer import TransformerDecoder, TransformerEncoder

    class Seq2SeqTransformer(HybridBlock):
        """Shared embedding -> GluonNLP TransformerEncoder / TransformerDecoder -> output layer
        tied to the embedding (module docstring). ``shape``: a value of TRANSFORMER_MODELS."""

        def __init__(self, shape, prefix=None):
            super().__init__(prefix=prefix)
            units, vocab = shape['units'], shape['vocab_size']
            common = dict(num_layers=shape['num_layers'], units=units,
                          hidden_size=shape['hidden_size'], num_heads=shape['num_heads'],
                          dropout=shape['dropout'], scaled=True, use_residual=True)
            with self.name_scope():
                self.embed = nn.Embedding(vocab, units, prefix='embed_')
                self.encoder = TransformerEncoder(max_length=MAX_POSITIONS, prefix='enc_',
                                                  **common)
                self.decoder = TransformerDecoder(max_length=MAX_POSITIONS, prefix='dec_',
                                                  **common)
                self.out = nn.Dense(vocab, flatten=False, use_bias=False, in_units=units,
                                    params=self.embed.params, prefix='out_')

        def hybrid_forward(self, F, src, tgt, src_valid_length, tgt_valid_length):
            # pylint: disable=arguments-differ
            memory, _ = self.encoder(self.embed(src), None, src_valid_length)
            positions = F.reshape(F.contrib.arange_like(src, axis=1), shape=(1, -1))
            memory_mask = F.broadcast_lesser(positions,
                                             F.reshape(src_valid_length, shape=(-1, 1)))
            hidden, _, _ = self.decoder(self.embed(tgt), [memory, memory_mask],
                                        tgt_valid_length)
            return self.out(hidden)

    return Seq2SeqTransformer


def sentence_batches(mx, name, batch, max_len, ctx, rng, count=NUM_BATCHES):
    """``count`` synthetic batches of sentence pairs (module docstring).

    Args:
        mx (module): mxnet.
        name (str): a key of :data:`TRANSFORMER_MODELS` (the vocabulary size).
        batch (int): sentence pairs per batch.
        max_len (int): longest sentence, 1 to :data:`MAX_POSITIONS`; lengths are drawn from
            ``min(MIN_LEN, max_len)`` to ``max_len``.
        ctx (mxnet.Context): where the arrays go.
        rng (numpy.random.RandomState): lengths and token ids are drawn from it.
        count (int): batches.

    Returns:
        list of (inputs, labels): ``inputs`` is (src ids (batch, Ls), target ids (batch, Lt),
        source lengths (batch,), target lengths (batch,)), float32, in :data:`DATA_NAMES`
        order, Ls and Lt the longest sentence of the batch; ``labels`` is (next-token ids
        (batch, Lt), target lengths) for :func:`masked_loss`.

    Raises:
        BenchmarkError: ``max_len`` outside 1..512.
    """
    if not 1 <= max_len <= MAX_POSITIONS:
        raise BenchmarkError('--seq-len %d: the transformer takes sentences of 1 to %d tokens'
                             % (max_len, MAX_POSITIONS))
    vocab = TRANSFORMER_MODELS[name]['vocab_size']
    low = min(MIN_LEN, max_len)
    out = []
    for _ in range(count):
        src_len = rng.randint(low, max_len + 1, size=batch)
        tgt_len = rng.randint(low, max_len + 1, size=batch)
        src = _padded(rng, src_len, vocab)
        tokens = _padded(rng, tgt_len + 1, vocab)  # decoder input and next tokens: shifted
        inputs = tuple(mx.nd.array(a, ctx=ctx) for a in (
            src, tokens[:, :-1], src_len.astype('float32'), tgt_len.astype('float32')))
        out.append((inputs, (mx.nd.array(tokens[:, 1:], ctx=ctx), inputs[3])))
    return out


def _padded(rng, lengths, vocab):
    """(len(lengths), max(lengths)) float32 token ids, zero after each sentence's length."""
    ids = rng.randint(1, vocab, size=(len(lengths), int(lengths.max()))).astype('float32')
    ids[np.arange(ids.shape[1])[None, :] >= lengths[:, None]] = 0
    return ids


def masked_loss():
    """``loss(logits, labels)``: GluonNLP's ``MaskedSoftmaxCELoss`` over the valid target
    tokens, per sentence (batch,), with ``labels`` = (next-token ids, target lengths)."""
    loss = _gluonnlp().loss.MaskedSoftmaxCELoss()

    def call(logits, labels):
        return loss(logits, labels[0], labels[1])
    return call


def tokens_per_sentence(batches):
    """Valid target tokens per sentence over ``batches`` (float): sentences/s times this is
    target tokens/s."""
    return float(np.mean(np.concatenate([b[0][3].asnumpy() for b in batches])))

