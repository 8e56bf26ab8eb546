"""BERT in the benchmark: GluonNLP 0.10's BERT encoder with random weights and a sentence
classifier on top, fed synthetic token ids.

``bert_base`` is GluonNLP's ``bert_12_768_12`` (12 layers, 768 units, 12 heads, feed-forward
3072, dropout 0.1, maximum length 512, 2 token types) over the 30,522-token vocabulary of the
uncased English BERT; ``bert_tiny`` (2 layers, 64 units, 4 heads, feed-forward 256, same
vocabulary) is a smoke configuration that runs the same code in seconds. Both are built from
GluonNLP's ``BERTEncoder``/``BERTModel``/``BERTClassifier`` classes directly, with
``mx.init.Normal(0.02)`` weights, so nothing is downloaded (``get_model('bert_12_768_12')``
would fetch the vocabulary even with ``pretrained=False``).

GluonNLP is an optional extra: ``pip install -e .[bert]`` (``gluonnlp==0.10.0``, which builds a
small Cython extension with the system's C compiler). Without it :func:`require_gluonnlp`
raises :class:`~benchmarks.modes.BenchmarkError` naming that command.

GluonNLP's self-attention runs on MXNet's ``interleaved_matmul_selfatt_qk`` and
``interleaved_matmul_selfatt_valatt``, which ``mxnet.contrib.amp`` puts in none of its bfloat16
lists: contrib.amp leaves them untouched, so ``valatt`` receives the bfloat16 projection and the
float32 softmax and MXNet's type inference refuses the graph. With those two in float32,
training fails next in ``Dropout`` ("Unknown type enum 12": MXNet 1.9.1's Dropout has no
bfloat16 kernel, and contrib.amp's lists leave it untouched, so it receives the bfloat16 output
of a FullyConnected). :data:`FP32_WORKAROUND_OPS` (both attention matmuls and Dropout) are the
ops the benchmark's ``contrib_amp_fp32_attention`` mode keeps in float32: ``amp.init(fp32_ops=
...)`` for training, ``excluded_sym_names`` of those nodes for ``convert_hybrid_block`` (its
``fp32_ops`` accepts only ops of contrib.amp's own lists).
"""
from benchmarks.modes import BenchmarkError

__all__ = ['BERT_MODELS', 'ATTENTION_OPS', 'FP32_WORKAROUND_OPS', 'DATA_NAMES', 'require_gluonnlp',
           'build_bert',
           'bert_inputs', 'bert_labels', 'workaround_node_names']

#: model name -> encoder shape (vocab_size: word-embedding rows).
BERT_MODELS = {
    'bert_base': dict(num_layers=12, units=768, hidden_size=3072, num_heads=12,
                      vocab_size=30522, dropout=0.1),
    'bert_tiny': dict(num_layers=2, units=64, hidden_size=256, num_heads=4,
                      vocab_size=30522, dropout=0.1),
}
#: GluonNLP BERT's attention matmuls (operator names as in the graph's JSON).
ATTENTION_OPS = ('_contrib_interleaved_matmul_selfatt_qk',
                 '_contrib_interleaved_matmul_selfatt_valatt')
#: What contrib.amp must keep in float32 to run GluonNLP's BERT in bfloat16 (see above).
FP32_WORKAROUND_OPS = ATTENTION_OPS + ('Dropout',)
#: The inputs of the classifier, in call order: token ids (float32, batch x length), token types
#: (0 or 1, float32, batch x length) and valid length (float32, batch).
DATA_NAMES = ('inputs', 'token_types', 'valid_length')
MAX_LENGTH = 512
NUM_CLASSES = 2
INSTALL_HINT = "pip install -e '.[bert]' (gluonnlp==0.10.0)"


def require_gluonnlp():
    """Import GluonNLP's BERT classes.

    Returns:
        module: ``gluonnlp.model.bert``.

    Raises:
        BenchmarkError: GluonNLP is not installed or cannot be imported; the message names the
            install command.
    """
    try:
        from gluonnlp.model import bert
    except ImportError as err:
        raise BenchmarkError('the BERT models need GluonNLP 0.10: %s (%s)'
                             % (INSTALL_HINT, err)) from err
    return bert


def build_bert(name, dropout=None):
    """A BERT sentence classifier with uninitialized (random-to-be) weights.

    Args:
        name (str): a key of :data:`BERT_MODELS`.
        dropout (float or None): dropout of the encoder and classifier; None: the model's own
            (0.1). The loss check passes 0 so that float32 and mxmp see the same function.

    Returns:
        gluonnlp.model.BERTClassifier: call it as ``net(inputs, token_types, valid_length)``
        (see :data:`DATA_NAMES`); it returns float32 logits of shape (batch, 2). Initialize it
        with ``net.initialize(mx.init.Normal(0.02))``.

    Raises:
        BenchmarkError: unknown ``name`` or no GluonNLP.
    """
    if name not in BERT_MODELS:
        raise BenchmarkError('unknown BERT model %r; use one of %s'
                             % (name, ', '.join(BERT_MODELS)))
    bert = require_gluonnlp()
    shape = dict(BERT_MODELS[name])
    if dropout is not None:
        shape['dropout'] = dropout
    encoder = bert.BERTEncoder(num_layers=shape['num_layers'], units=shape['units'],
                               hidden_size=shape['hidden_size'], max_length=MAX_LENGTH,
                               num_heads=shape['num_heads'], dropout=shape['dropout'])
    model = bert.BERTModel(encoder, shape['vocab_size'], token_type_vocab_size=2,
                           units=shape['units'], embed_size=shape['units'], use_pooler=True,
                           use_decoder=False, use_classifier=False)
    return bert.BERTClassifier(model, num_classes=NUM_CLASSES, dropout=shape['dropout'])


def bert_inputs(mx, name, batch, seq_len, ctx, rng):
    """A synthetic batch: every sequence ``seq_len`` tokens long, the second half token type 1.

    Args:
        mx (module): mxnet.
        name (str): a key of :data:`BERT_MODELS` (for the vocabulary size).
        batch (int): sequences.
        seq_len (int): tokens per sequence, at most 512.
        ctx (mxnet.Context): where the arrays go.
        rng (numpy.random.RandomState): token ids are drawn from it.

    Returns:
        tuple of NDArray: (token ids (batch, seq_len), token types (batch, seq_len), valid
        length (batch,)), all float32, in :data:`DATA_NAMES` order.

    Raises:
        BenchmarkError: ``seq_len`` outside 1..512.
    """
    if not 1 <= seq_len <= MAX_LENGTH:
        raise BenchmarkError('--seq-len %d: BERT takes 1 to %d tokens' % (seq_len, MAX_LENGTH))
    ids = rng.randint(0, BERT_MODELS[name]['vocab_size'], size=(batch, seq_len))
    types = (mx.nd.arange(seq_len, ctx=ctx) >= seq_len // 2).reshape((1, -1))
    return (mx.nd.array(ids, ctx=ctx), mx.nd.broadcast_to(types, (batch, seq_len)),
            mx.nd.full((batch,), seq_len, ctx=ctx))


def bert_labels(mx, batch, ctx, rng):
    """Class labels (float32, shape (batch,), values 0 or 1) drawn from ``rng``."""
    return mx.nd.array(rng.randint(0, NUM_CLASSES, size=batch), ctx=ctx)


def workaround_node_names(sym):
    """Names of the :data:`FP32_WORKAROUND_OPS` nodes of ``sym`` (mxnet.sym.Symbol), in graph
    order (list of str)."""
    import json
    return [n['name'] for n in json.loads(sym.tojson())['nodes']
            if n['op'] in FP32_WORKAROUND_OPS]
