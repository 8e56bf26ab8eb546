"""A small GPT-style character language model on the King James Bible, for the transformer
accuracy study (:mod:`benchmarks.accuracy_transformer`).

One training run::

    python -m benchmarks.gpt --dtype bfloat16 --seed 0 --save-dir RUN_DIR

The text is Debian's ``bible-kjv`` (``bible gen1:1-rev22:21``: 4,298,239 characters, 73 distinct).
Validation is a fixed held-out part: everything from Hebrews 1 to the end (Hebrews, the General
Epistles and Revelation: 158,926 characters, 3.7%); training is everything before it. Tokens are
characters: the 73-symbol vocabulary keeps the output layer small (a word-level vocabulary of
the text has 29,049 whitespace-separated forms, whose output layer alone would cost several
times the transformer body per token; see docs/accuracy.md).

The model is a pre-LayerNorm decoder: token embedding + learned position embedding, ``layers``
blocks of causal multi-head self-attention and a GELU MLP (4x), a final LayerNorm and a dense
output layer. ``--arch post-ln`` makes it post-LayerNorm, as BERT and the original transformer:
a LayerNorm of the embedding sum, then blocks ``x = LayerNorm(x + Dropout(f(x)))`` for the
attention and the MLP, and the output layer reads the last block's LayerNorm (the same
parameters, drawn in the same order: the final LayerNorm's become the embedding LayerNorm's).
There the LayerNorm outputs are the residual stream, which ``--residual-dtype target`` holds in
bfloat16. Attention uses MXNet's interleaved self-attention ops
(``interleaved_matmul_selfatt_qk`` / ``_valatt``: data laid out (time, batch, channels), no
transpose) with an additive causal mask and ``softmax``; Dropout after the embedding, on the
attention weights and on each residual branch.

Training: Adam, linear warm-up then cosine decay, loss = mean cross-entropy over every token of
the batch, global gradient-norm clipping. float32 runs use ``gluon.Trainer`` (an independent
reference); ``bfloat16``/``float16`` run ``mxmp.convert(net, dtype)`` + ``mxmp.Trainer``
(``loss_scaler='auto'``: none for bfloat16, dynamic for float16; ``trainer.unscale()`` before the
clipping). Runs with one seed start from the same weights and see the same windows in the same
order, whatever the dtype.

Outputs in ``--save-dir``: ``metrics.jsonl`` (one line per step: step, loss, loss_scale,
skipped, lr, and on a skipped step ``nonfinite_grads``, {parameter: non-finite entries}; one per evaluation: step, val_loss, train_loss over the steps since the last one),
``summary.json`` (configuration, final validation loss and perplexity, curves, timings).
"""
import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import time

import numpy as np

BIBLE_COMMAND = ('bible', 'gen1:1-rev22:21')
VALIDATION_START = '\nHebrews 1\n'
INSTALL_HINT = ('the King James Bible comes from Debian\'s bible-kjv package: install it with '
                '`sudo apt-get install -y bible-kjv` (or `sudo bash scripts/install_dataset.sh`)')


#: ``--arch`` choices: where the LayerNorms sit (:func:`build_gpt`).
ARCHS = ('pre-ln', 'post-ln')


class DataMissing(RuntimeError):
    """The ``bible`` command (Debian's bible-kjv) is not installed."""


def load_bible():
    """The King James Bible as text, from ``bible gen1:1-rev22:21``.

    Returns str (4,298,239 characters with bible-kjv 4.38). Raises DataMissing naming the apt
    command when the ``bible`` program is missing or fails.
    """
    if shutil.which(BIBLE_COMMAND[0]) is None:
        raise DataMissing('`%s` not found: %s' % (BIBLE_COMMAND[0], INSTALL_HINT))
    proc = subprocess.run(list(BIBLE_COMMAND), capture_output=True, text=True)
    if proc.returncode != 0 or len(proc.stdout) < 10 ** 6:
        raise DataMissing('`%s` failed (exit %d, %d characters): %s'
                          % (' '.join(BIBLE_COMMAND), proc.returncode, len(proc.stdout),
                             INSTALL_HINT))
    return proc.stdout


def split_text(text):
    """(train, validation): validation is the text from Hebrews 1 to the end.

    Raises ValueError when the text has no ``Hebrews 1`` heading."""
    cut = text.find(VALIDATION_START)
    if cut < 0:
        raise ValueError('no %r heading in the text: not the output of `%s`'
                         % (VALIDATION_START.strip(), ' '.join(BIBLE_COMMAND)))
    return text[:cut + 1], text[cut + 1:]


def encode(text, vocab):
    """Characters -> int32 ids of ``vocab`` (a sorted string of the distinct characters)."""
    table = np.zeros(0x110000 if max(map(ord, vocab)) > 255 else 256, dtype=np.int32)
    table[[ord(c) for c in vocab]] = np.arange(len(vocab), dtype=np.int32)
    return table[np.frombuffer(text.encode('utf-32-le'), dtype=np.uint32)]


def validation_windows(ids, context):
    """Non-overlapping windows of the validation ids: (inputs, targets), each (n, context),
    n = (len(ids) - 1) // context; every validation character but the first is a target once."""
    n = (len(ids) - 1) // context
    x = ids[:n * context].reshape(n, context)
    y = ids[1:n * context + 1].reshape(n, context)
    return x, y


def ngram_perplexity(train_ids, val_ids, n, vocab_size, k=0.1):
    """Perplexity on ``val_ids`` of a character n-gram model counted on ``train_ids``, with
    add-``k`` smoothing: p(c | context) = (count(context, c) + k) / (count(context) + k * V).
    A yardstick for the GPT's perplexity (``python -m benchmarks.gpt --baselines``)."""
    def codes(ids):
        m = len(ids) - n + 1
        ctx = np.zeros(m, dtype=np.int64)
        for i in range(n - 1):
            ctx = ctx * vocab_size + ids[i:m + i]
        return ctx, ctx * vocab_size + ids[n - 1:]
    train_ctx, train_full = codes(np.asarray(train_ids, dtype=np.int64))
    val_ctx, val_full = codes(np.asarray(val_ids, dtype=np.int64))

    def counts(keys, table):
        uniq, cnt = np.unique(table, return_counts=True)
        pos = np.clip(np.searchsorted(uniq, keys), 0, len(uniq) - 1)
        return np.where(uniq[pos] == keys, cnt[pos], 0)
    p = (counts(val_full, train_full) + k) / (counts(val_ctx, train_ctx) + k * vocab_size)
    return float(np.exp(-np.mean(np.log(p))))


def baselines(log=print):
    """Print the validation perplexity of character n-gram models (n = 1..4), counted on the
    training part: what the GPT's perplexity is measured against."""
    text = load_bible()
    vocab = ''.join(sorted(set(text)))
    train_text, val_text = split_text(text)
    train_ids, val_ids = encode(train_text, vocab), encode(val_text, vocab)
    for n in (1, 2, 3, 4):
        log('%d-gram (add-0.1 smoothing): validation perplexity %.3f'
            % (n, ngram_perplexity(train_ids, val_ids, n, len(vocab))))


def build_gpt(vocab_size, units, layers, heads, context, dropout, arch='pre-ln'):
    """The GPT HybridBlock (the classes are made here so that importing this module does not
    import MXNet). Input: token ids (context, batch) float32 and the additive causal mask
    (1, context, context); output: logits (context, batch, vocab_size). ``arch``: 'pre-ln'
    (``x + f(LayerNorm(x))``, a final LayerNorm) or 'post-ln' (``LayerNorm(x + f(x))``, a
    LayerNorm of the embedding sum); ValueError for anything else."""
    if arch not in ARCHS:
        raise ValueError('arch=%r: use one of %s' % (arch, ', '.join(ARCHS)))
    post = arch == 'post-ln'
    from mxnet.gluon import nn, HybridBlock
    from mxnet import init

    class SelfAttention(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.qkv = nn.Dense(3 * units, flatten=False, in_units=units)
            self.drop = nn.Dropout(dropout)
            self.proj = nn.Dense(units, flatten=False, in_units=units)

        def hybrid_forward(self, F, x, mask):
            qkv = self.qkv(x)                                             # (T, B, 3C)
            scores = F.contrib.interleaved_matmul_selfatt_qk(qkv, heads=heads)  # (B*H, T, T)
            weights = self.drop(F.softmax(F.broadcast_add(scores, mask), axis=-1))
            out = F.contrib.interleaved_matmul_selfatt_valatt(qkv, weights, heads=heads)
            return self.proj(out)                                         # (T, B, C)

    class Block(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.ln1 = nn.LayerNorm(in_channels=units)
            self.attn = SelfAttention()
            self.drop1 = nn.Dropout(dropout)
            self.ln2 = nn.LayerNorm(in_channels=units)
            self.fc1 = nn.Dense(4 * units, flatten=False, in_units=units)
            self.act = nn.GELU()
            self.fc2 = nn.Dense(units, flatten=False, in_units=4 * units)
            self.drop2 = nn.Dropout(dropout)

        def hybrid_forward(self, F, x, mask):
            if post:
                x = self.ln1(x + self.drop1(self.attn(x, mask)))
                return self.ln2(x + self.drop2(self.fc2(self.act(self.fc1(x)))))
            x = x + self.drop1(self.attn(self.ln1(x), mask))
            return x + self.drop2(self.fc2(self.act(self.fc1(self.ln2(x)))))

    class GPT(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.embed = nn.Embedding(vocab_size, units, weight_initializer=init.Normal(0.02))
            self.pos_weight = self.params.get('pos_weight', shape=(context, 1, units),
                                              init=init.Normal(0.02))
            self.drop = nn.Dropout(dropout)
            self.blocks = nn.HybridSequential()
            for _ in range(layers):
                self.blocks.add(Block())
            self.ln_f = nn.LayerNorm(in_channels=units)   # post-ln: of the embedding sum
            self.head = nn.Dense(vocab_size, flatten=False, in_units=units)

        def hybrid_forward(self, F, tokens, mask, pos_weight):
            x = F.broadcast_add(self.embed(tokens), pos_weight)
            x = self.drop(self.ln_f(x) if post else x)
            for block in self.blocks:
                x = block(x, mask)
            return self.head(x if post else self.ln_f(x))

    return GPT()


def float32_library_kernels(net, kernels):
    """``net`` (the float32 GPT, initialized) as a SymbolBlock whose graph went through mxmp's
    kernel rule with ``kernels`` ('auto' or 'all') but stays float32 everywhere: the library's
    kernels without the precision, the control of the transformer study (docs/accuracy.md).
    The parameters are ``net``'s own. Raises RuntimeError when the library does not load."""
    import mxnet as mx
    from mxnet import gluon
    from mxmp._src.graph.kernel_rule import apply_kernels
    from mxmp._src.graph.symbol_json import dump, load
    from mxmp._src.kernels.build import load_library
    if load_library() is None:
        raise RuntimeError("mxmp's operator library does not load here: --kernels %s needs it"
                           % kernels)
    inputs = [mx.sym.var('tokens'), mx.sym.var('mask')]
    graph = apply_kernels(load(net(*inputs)), kernels)
    return gluon.SymbolBlock(dump(graph), inputs, params=net.collect_params())


def causal_mask(context):
    """(1, context, context) float32: 0 where key <= query, -1e4 above the diagonal (exp
    underflows to 0 in the float32 softmax; -1e4 also fits float16)."""
    return np.triu(np.full((context, context), -1e4, dtype=np.float32), k=1)[None]


def build_parser():
    p = argparse.ArgumentParser(prog='python -m benchmarks.gpt', description=__doc__.split('\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--dtype', choices=('float32', 'bfloat16', 'float16'), default='float32')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--steps', type=int, default=300)
    p.add_argument('--batch-size', type=int, default=32)
    p.add_argument('--context', type=int, default=128)
    p.add_argument('--units', type=int, default=128)
    p.add_argument('--layers', type=int, default=3)
    p.add_argument('--heads', type=int, default=4)
    p.add_argument('--dropout', type=float, default=0.1)
    p.add_argument('--lr', type=float, default=2e-3, help='peak Adam learning rate')
    p.add_argument('--warmup-steps', type=int, default=30)
    p.add_argument('--clip', type=float, default=1.0, help='global gradient-norm bound')
    p.add_argument('--eval-interval', type=int, default=30,
                   help='steps between evaluations on --curve-windows validation windows')
    p.add_argument('--curve-windows', type=int, default=256,
                   help='validation windows (evenly spaced) of the curve; the final evaluation '
                        'uses every window')
    p.add_argument('--eval-batch-size', type=int, default=64,
                   help='validation windows per inference batch')
    p.add_argument('--max-val-windows', type=int, default=None,
                   help='cap the final evaluation at the first N windows (tests; the study '
                        'uses every window)')
    p.add_argument('--skip-updates', type=lambda t: sorted({int(x) for x in t.split(',') if x}),
                   default=[], help='steps (comma-separated) whose update is left out, the batch '
                                    'consumed and its gradients discarded, as a loss-scale '
                                    'overflow does: to measure what one skipped step costs')
    p.add_argument('--kernels', choices=('default', 'mxnet', 'auto', 'all'), default='default',
                   help="mxmp's operator library (the pass's kernel rule): 'default' is "
                        "MXNet's kernels in float32 and Policy's default ('auto') otherwise; "
                        "'mxnet', 'auto' or 'all' set Policy(kernels=...) for bfloat16/float16 "
                        "and, in float32, apply the rule to the float32 graph ('auto' and "
                        "'all': the library's LayerNorm and Dropout), which measures the "
                        "library's kernels without the precision")
    p.add_argument('--residual-dtype', choices=('float32', 'target'), default='float32',
                   help="bfloat16/float16: Policy(residual_dtype=...), the dtype of a LayerNorm's "
                        "output for its consumers (with --arch pre-ln the LayerNorms feed matrix "
                        "products only; with post-ln they are the residual stream)")
    p.add_argument('--arch', choices=ARCHS, default='pre-ln',
                   help="'pre-ln': x + f(LayerNorm(x)) (GPT-2's); 'post-ln': "
                        "LayerNorm(x + f(x)) (BERT's), where the LayerNorm outputs are the "
                        "residual stream")
    p.add_argument('--mask-seed', type=int, default=None,
                   help="reseed MXNet's generator with this after the weights are drawn: the "
                        "Dropout masks change, the weights and the windows stay --seed's (the "
                        "noise of the masks alone)")
    p.add_argument('--save-dir', help='where the run writes its files (required to train)')
    p.add_argument('--baselines', action='store_true',
                   help='train nothing; print the validation perplexity of character n-gram '
                        'models (n = 1..4) for comparison')
    return p


def evaluate(net, mask, x, y, batch_size):
    """Mean cross-entropy (nats per character) of ``net`` over windows (x, y), (n, T) each.

    Batches have ``batch_size`` windows; the last is padded with repeats that are not counted."""
    import mxnet as mx
    total, count = 0.0, 0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        n = len(xb)
        if n < batch_size:
            pad = np.resize(np.arange(n), batch_size - n)
            xb, yb = np.concatenate([xb, xb[pad]]), np.concatenate([yb, yb[pad]])
        logits = net(mx.nd.array(xb.T), mask)                        # (T, B, V)
        logp = mx.nd.log_softmax(logits.astype('float32'), axis=-1)
        nll = -mx.nd.pick(logp, mx.nd.array(yb.T), axis=-1)          # (T, B)
        total += float(nll[:, :n].sum().asscalar())
        count += n * x.shape[1]
    return total / count


def make_trainer(args, net, steps):
    """gluon.Trainer for float32, mxmp.Trainer otherwise; Adam, warm-up + cosine schedule."""
    import mxnet as mx
    from mxnet import gluon
    schedule = mx.lr_scheduler.CosineScheduler(
        max_update=steps, base_lr=args.lr, final_lr=args.lr * 0.05,
        warmup_steps=args.warmup_steps, warmup_begin_lr=0.0)
    opt = {'learning_rate': args.lr, 'lr_scheduler': schedule, 'beta1': 0.9, 'beta2': 0.99}
    if args.dtype == 'float32':
        return gluon.Trainer(net.collect_params(), 'adam', opt)
    import mxmp
    return mxmp.Trainer(net.collect_params(), 'adam', opt, loss_scaler='auto',
                        target_dtype=args.dtype)


def train(args, log=print):
    """Train one run as ``args`` say (:func:`build_parser`); returns the summary dict (also
    written to ``SAVE_DIR/summary.json``)."""
    import mxnet as mx
    from mxnet import autograd, gluon
    os.makedirs(args.save_dir, exist_ok=True)
    text = load_bible()
    vocab = ''.join(sorted(set(text)))
    train_text, val_text = split_text(text)
    train_ids, val_ids = encode(train_text, vocab), encode(val_text, vocab)
    val_x, val_y = validation_windows(val_ids, args.context)
    if args.max_val_windows:
        val_x, val_y = val_x[:args.max_val_windows], val_y[:args.max_val_windows]
    curve_idx = np.unique(np.linspace(0, len(val_x) - 1, min(args.curve_windows, len(val_x)))
                          .astype(int))

    np.random.seed(args.seed)
    mx.random.seed(args.seed)
    rng = np.random.RandomState(args.seed)
    starts = rng.randint(0, len(train_ids) - args.context - 1, size=(args.steps, args.batch_size))
    net = build_gpt(len(vocab), args.units, args.layers, args.heads, args.context, args.dropout,
                    args.arch)
    net.initialize(mx.init.Normal(0.02))
    if args.mask_seed is not None:
        mx.random.seed(args.mask_seed)
    emulate = None
    if args.dtype != 'float32':
        import mxmp
        emulate = not mxmp.lp_kernels_available(args.dtype)
        # residual_dtype always explicit: the records' --residual-dtype (default float32)
        # is what ran, whatever Policy's default
        fields = {'residual_dtype': args.residual_dtype}
        if args.kernels != 'default':
            fields['kernels'] = args.kernels
        policy = mxmp.Policy(args.dtype, **fields)
        net = mxmp.convert(net, args.dtype, policy=policy)
    elif args.kernels in ('auto', 'all'):
        net = float32_library_kernels(net, args.kernels)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = make_trainer(args, net, args.steps)
    params = [p for p in net.collect_params().values() if p.grad_req != 'null']
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(axis=-1)
    mask = mx.nd.array(causal_mask(args.context))
    offsets = np.arange(args.context + 1)

    metrics = open(os.path.join(args.save_dir, 'metrics.jsonl'), 'w')
    curve, window_losses, skipped, step_times = [], [], 0, []

    def record_eval(step):
        with autograd.predict_mode():
            val = evaluate(net, mask, val_x[curve_idx], val_y[curve_idx], args.eval_batch_size)
        train_loss = float(np.mean(window_losses)) if window_losses else None
        curve.append({'step': step, 'val_loss': val, 'train_loss': train_loss})
        metrics.write(json.dumps(curve[-1]) + '\n')
        metrics.flush()
        log('step %d: train loss %s, val loss %.4f (ppl %.3f) on %d windows'
            % (step, '%.4f' % train_loss if train_loss is not None else 'n/a', val,
               math.exp(val), len(curve_idx)))
        window_losses.clear()

    record_eval(0)
    tic = time.time()
    for step in range(1, args.steps + 1):
        chunk = train_ids[starts[step - 1][:, None] + offsets]              # (B, T + 1)
        x = mx.nd.array(chunk[:, :-1].T)
        y = mx.nd.array(chunk[:, 1:].T)
        t0 = time.time()
        with autograd.record():
            loss = loss_fn(net(x, mask), y).mean()      # mean over every token of the batch
            if args.dtype == 'float32':
                loss.backward()
            else:
                with trainer.scale_loss(loss) as scaled:
                    scaled.backward()
        scale = float(getattr(trainer, 'loss_scale', 1.0))   # the scale this backward used
        if args.dtype != 'float32':
            trainer.unscale()                                # clip unscaled gradients
        gluon.utils.clip_global_norm([p.grad() for p in params], args.clip,
                                     check_isfinite=False)
        applied = False if step in args.skip_updates else trainer.step(1)
        loss_value = float(loss.asscalar())
        step_times.append(time.time() - t0)
        was_skipped = applied is False
        skipped += was_skipped
        line = {'step': step, 'loss': loss_value if math.isfinite(loss_value) else None,
                'loss_scale': scale, 'skipped': was_skipped, 'lr': float(trainer.learning_rate)}
        if not was_skipped:
            window_losses.append(loss_value)
        else:
            # which gradients overflowed: {parameter: non-finite entries} (the clipping left
            # them non-finite and zeroed the rest)
            line['nonfinite_grads'] = {
                p.name: int((~np.isfinite(p.grad().asnumpy())).sum()) for p in params
                if not np.isfinite(p.grad().asnumpy()).all()}
        metrics.write(json.dumps(line) + '\n')
        if step % args.eval_interval == 0 or step == args.steps:
            record_eval(step)
    train_s = time.time() - tic
    with autograd.predict_mode():
        final = evaluate(net, mask, val_x, val_y, args.eval_batch_size)
    metrics.close()
    log('final: val loss %.4f, perplexity %.4f on %d characters'
        % (final, math.exp(final), val_x.size))
    summary = {
        'config': {k: v for k, v in vars(args).items() if k not in ('save_dir', 'baselines')},
        'emulate': emulate, 'vocab_size': len(vocab),
        'train_chars': len(train_ids), 'val_chars': int(val_x.size),
        'parameters': int(sum(p.data().size for p in net.collect_params().values())),
        'final_val_loss': final, 'final_val_ppl': math.exp(final), 'curve': curve,
        'skipped_steps': int(skipped),
        'loss_scale': float(getattr(trainer, 'loss_scale', 1.0)),
        'train_s': train_s, 'median_step_s': float(np.median(step_times[1:] or step_times)),
        'peak_rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        'cpu_s': resource.getrusage(resource.RUSAGE_SELF).ru_utime
        + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
    }
    with open(os.path.join(args.save_dir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    return summary


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.baselines and not args.save_dir:
        parser.error('--save-dir is required to train (or --baselines)')
    try:
        baselines() if args.baselines else train(args)
    except DataMissing as err:
        print('error: %s' % err)
        raise SystemExit(2)


if __name__ == '__main__':
    main()
