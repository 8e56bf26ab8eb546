"""GluonNLP 0.10's machine-translation training loop, timed per update: float32 against mxmp
converted the two ways a user converts such a script.

``python -m benchmarks.nmt_loop [--model transformer_nmt] [--layers 4] [--batch-size 32]
[--warmup 2] [--iters 6] [--repeats 3] [--modes float32 amp convert convert_loss]
[--kernels auto] [--profile] [--paired]``

The loop is written the way GluonNLP 0.10's ``scripts/machine_translation/train_transformer.py``
trains (read for its structure, nothing copied): ``nlp.model.translation.NMTModel`` over
``nlp.model.transformer.get_transformer_encoder_decoder`` (``--model transformer_nmt``: model
size 512, feed-forward 2048, 8 heads, 4 encoder and 4 decoder layers unless ``--layers``,
dropout 0.1, scaled attention), a source and target embedding shared and tied to the output
layer, over a 32,000-token vocabulary (``transformer_tiny``: the small shape, for tests);
``model.hybridize(static_alloc=True)``; ``nlp.loss.LabelSmoothing(epsilon=0.1, units=V)`` (the
one-hot targets, batch x length x V) and ``nlp.loss.MaskedSoftmaxCELoss(sparse_label=False)``,
both hybridized; the loss summed and divided by the rescale factor 100; Adam with
``beta2=0.98, epsilon=1e-9``; ``trainer.step(batch / 100)``. ``NMTModel`` is a plain
``gluon.Block`` whose children (embedding, encoder, decoder, output layer) are hybridized.

Modes, each in its own process, interleaved over the repeats (A B C A B C ...):

- ``float32``: the script as it is (``gluon.Trainer``).
- ``amp``: the contrib.amp pattern with ``from mxmp import amp``: ``amp.init('bfloat16')``
  before the model is built, ``amp.init_trainer(trainer)``, ``amp.scale_loss``; every
  hybridized child's graph runs mxmp's pass.
- ``convert``: ``mxmp.convert(model)`` (a plain Block: mxmp converts its HybridBlock
  children, the embedding, encoder, decoder and output layer), ``mxmp.Trainer``.
- ``convert_loss``: the same, and ``mxmp.convert`` on the label smoothing and the loss too
  (they have no matrix product, but the pass's reduction rule speeds up their float32 sums).

The batches are :func:`benchmarks.transformer.sentence_batches` (``--batch-size`` sentence
pairs of 8 to ``--seq-len`` tokens, padded per batch, 4 seeded batches cycled). One update is
forward, backward and ``trainer.step``, timed to ``mx.nd.waitall()``. ``--profile`` prints
MXNet's per-operator table of the timed updates (bulk execution off) for each mode instead.
``--paired`` runs float32 and one other mode in one process, their updates alternating, and
gives the ratio of each pair: on a machine shared with other jobs, both sides of a pair see
nearly the same load (amp cannot be paired: its switch is process-wide).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

MODES = ('float32', 'amp', 'convert', 'convert_loss')
RESCALE_LOSS = 100.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(mode, name, layers, kernels='auto'):
    """``(model, label_smoothing, loss_function, trainer, backward)`` of ``mode`` for the
    shape ``TRANSFORMER_MODELS[name]`` of benchmarks.transformer with ``layers`` layers;
    ``kernels``: the mxmp Policy's (``'all'``: mxmp's Dropout too)."""
    import mxnet as mx
    from mxnet import autograd, gluon
    import gluonnlp as nlp
    import mxmp
    from benchmarks.transformer import TRANSFORMER_MODELS
    shape = TRANSFORMER_MODELS[name]
    vocab = shape['vocab_size']
    if mode == 'amp':
        from mxmp import amp
        amp.init('bfloat16')
        if kernels != 'auto':   # amp.init's own policy, with the kernels asked for
            amp.init(amp._policy(None, None, None, None, None).replace(kernels=kernels))
    policy = mxmp.Policy('bfloat16', kernels=kernels)
    encoder, decoder, one_step = nlp.model.transformer.get_transformer_encoder_decoder(
        num_layers=layers or shape['num_layers'], num_heads=shape['num_heads'],
        units=shape['units'], hidden_size=shape['hidden_size'], dropout=shape['dropout'],
        scaled=True, max_src_length=512, max_tgt_length=512)
    model = nlp.model.translation.NMTModel(
        src_vocab=range(vocab), tgt_vocab=range(vocab), encoder=encoder, decoder=decoder,
        one_step_ahead_decoder=one_step, share_embed=True, embed_size=shape['units'],
        tie_weights=True,
        embed_initializer=None, prefix='transformer_')
    model.initialize(init=mx.init.Xavier(magnitude=3.0))
    if mode.startswith('convert'):
        mxmp.convert(model, policy=policy)   # a plain Block: its HybridBlock children
    model.hybridize(static_alloc=True)
    label_smoothing = nlp.loss.LabelSmoothing(epsilon=0.1, units=vocab)
    loss_function = nlp.loss.MaskedSoftmaxCELoss(sparse_label=False)
    if mode == 'convert_loss':
        mxmp.convert(label_smoothing, policy=policy)
        mxmp.convert(loss_function, policy=policy)
    label_smoothing.hybridize(static_alloc=True)
    loss_function.hybridize(static_alloc=True)
    opt = {'learning_rate': 1e-4, 'beta2': 0.98, 'epsilon': 1e-9}
    if mode.startswith('convert'):
        trainer = mxmp.Trainer(model.collect_params(), 'adam', opt)

        def backward(loss):
            with trainer.scale_loss(loss) as scaled:
                scaled.backward()
    else:
        trainer = gluon.Trainer(model.collect_params(), 'adam', opt)
        if mode == 'amp':
            from mxmp import amp
            amp.init_trainer(trainer)

            def backward(loss):
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
        else:
            def backward(loss):
                loss.backward()
    return model, label_smoothing, loss_function, trainer, backward


def make_update(mode, args, losses):
    """``((model, loss_function), update)``: ``update(k)`` runs update ``k`` of ``mode`` (batch ``k`` mod 4)
    and appends its loss to ``losses``."""
    import mxnet as mx
    from mxnet import autograd
    from benchmarks.transformer import sentence_batches
    mx.random.seed(0)
    model, smoothing, loss_fn, trainer, backward = build(mode, args.model, args.layers, args.kernels)
    batches = sentence_batches(mx, args.model, args.batch_size, args.seq_len, mx.cpu(),
                               np.random.RandomState(0))

    def update(k):
        (src, tgt, src_len, tgt_len), (labels, _) = batches[k % len(batches)]
        with autograd.record():
            out, _ = model(src, tgt, src_len, tgt_len)
            loss = loss_fn(out, smoothing(labels), tgt_len).sum() / RESCALE_LOSS
            backward(loss)
        trainer.step(args.batch_size / RESCALE_LOSS)
        losses.append(loss)
        mx.nd.waitall()
    return (model, loss_fn), update


def run_paired(mode, args):
    """float32 and ``mode`` in one process, their updates alternating (float32, mode, ...), so
    that both see the same load: a result dict with both modes' times."""
    import mxnet as mx
    from benchmarks.profile import parse_aggregate
    updates, losses = {}, {}
    for m in ('float32', mode):
        losses[m] = []
        updates[m] = make_update(m, args, losses[m])[1]
        for k in range(args.warmup):
            updates[m](k)
    times = {m: [] for m in updates}
    ops = {m: {} for m in updates}   # --profile: op -> ms over the timed updates
    for k in range(args.warmup, args.warmup + args.iters):
        for m in updates:
            if args.profile:
                mx.profiler.set_config(profile_all=True, aggregate_stats=True)
                mx.profiler.set_state('run')
            start = time.perf_counter()
            updates[m](k)
            times[m].append(time.perf_counter() - start)
            if args.profile:
                mx.profiler.set_state('stop')
                table = parse_aggregate(mx.profiler.dumps(reset=True)).get('operator', {})
                for op, row in table.items():
                    ops[m][op] = ops[m].get(op, 0.0) + row['total_ms'] / args.iters
    return {'mode': mode, 'update_s': times, 'ops_ms': ops if args.profile else None,
            'loss': {m: [float(l.asscalar()) * RESCALE_LOSS for l in losses[m]] for m in losses}}


def run_mode(mode, args):
    """One process: build, warm up, time ``args.iters`` updates; a result dict."""
    import mxnet as mx
    losses = []
    (model, loss_fn), update = make_update(mode, args, losses)
    for k in range(args.warmup):
        update(k)
    if args.profile:
        mx.profiler.set_config(profile_all=True, aggregate_stats=True)
        mx.profiler.set_state('run')
    times = []
    for k in range(args.warmup, args.warmup + args.iters):
        start = time.perf_counter()
        update(k)
        times.append(time.perf_counter() - start)
    result = {'mode': mode, 'update_s': times,
              'loss': [float(l.asscalar()) * RESCALE_LOSS for l in losses],
              'fc_dtypes': _fc_dtypes(model, loss_fn)}
    if args.profile:
        mx.profiler.set_state('stop')
        result['profile'] = mx.profiler.dumps(reset=True)
    return result


def _fc_dtypes(model, loss_fn):
    """FullyConnected and batch_dot nodes and casts of the decoder's graph as it ran, and the
    FullyConnected nodes of the loss's graph (the reduction rule's)."""
    import mxmp

    def ops(block):
        graph = getattr(block, '_cached_graph', None)
        return [] if not graph else [n['op'] for n in json.loads(
            graph[1].tojson(remove_amp_cast=False))['nodes']]
    graph = getattr(model.decoder, '_cached_graph', None)
    if not graph:
        return None
    counts = {op: ops(model.decoder).count(op) for op in ('FullyConnected', 'batch_dot')}
    return {'decoder_nodes': counts, 'casts': mxmp.count_casts(graph[1]),
            'loss_fc': ops(loss_fn).count('FullyConnected')}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--model', default='transformer_nmt', choices=('transformer_nmt',
                                                                  'transformer_tiny'),
                   help='shape (benchmarks.transformer.TRANSFORMER_MODELS)')
    p.add_argument('--layers', type=int, default=None,
                   help="encoder and decoder layers each (default: the model's)")
    p.add_argument('--batch-size', type=int, default=32, help='sentence pairs per update')
    p.add_argument('--seq-len', type=int, default=40, help='longest sentence (tokens)')
    p.add_argument('--warmup', type=int, default=2, help='untimed updates per process')
    p.add_argument('--iters', type=int, default=6, help='timed updates per process')
    p.add_argument('--repeats', type=int, default=3, help='interleaved processes per mode')
    p.add_argument('--modes', nargs='+', choices=MODES, default=list(MODES))
    p.add_argument('--profile', action='store_true',
                   help="per-operator time (MXNet's profiler, bulk execution off), one repeat")
    p.add_argument('--kernels', default='auto', choices=('auto', 'all', 'mxnet'),
                   help="mxmp.Policy(kernels=...) of the mxmp modes ('all': mxmp's Dropout)")
    p.add_argument('--paired', action='store_true',
                   help='float32 and each other mode in one process, updates alternating '
                        '(ratios robust to a shared machine\'s load; not amp, whose switch is '
                        'process-wide)')
    p.add_argument('--child', choices=MODES, help=argparse.SUPPRESS)
    p.add_argument('--child-paired', choices=MODES, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    if args.child:
        print('RESULT ' + json.dumps(run_mode(args.child, args)))
        return 0
    if args.child_paired:
        print('RESULT ' + json.dumps(run_paired(args.child_paired, args)))
        return 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    if args.profile:
        env.update(MXNET_EXEC_BULK_EXEC_TRAIN='0', MXNET_EXEC_BULK_EXEC_INFERENCE='0')
        args.repeats = 1
    if args.paired:
        return paired_main(args, env)
    print('load average at start: %.1f' % os.getloadavg()[0])
    runs = {m: [] for m in args.modes}
    for rep in range(args.repeats):
        for mode in args.modes:
            res = _run_child('--child', mode, rep, args, env)
            if res is None:
                continue
            runs[mode].append(res)
            print('repeat %d %-8s median %.3f s/update  losses %s  %s' % (
                rep, mode, np.median(res['update_s']),
                ' '.join('%.3f' % l for l in res['loss'][:4]), res['fc_dtypes']), flush=True)
            if args.profile:
                print(res['profile'])
    print('load average at end: %.1f' % os.getloadavg()[0])
    base = [np.median(r['update_s']) for r in runs.get('float32', [])]
    for mode in args.modes:
        meds = [np.median(r['update_s']) for r in runs[mode]]
        if not meds:
            continue
        ratio = ''
        if base and mode != 'float32':
            per = ['%.2f' % (b / m) for b, m in zip(base, meds)]
            ratio = '  x float32 %.2f (per repeat %s)' % (np.median(base) / np.median(meds),
                                                           ' '.join(per))
        print('%-8s median of repeat medians %.3f s/update%s' % (mode, np.median(meds), ratio))
    return 0


def _run_child(flag, mode, rep, args, env):
    """Run one child process (``flag``: ``--child`` or ``--child-paired``) of ``mode`` and
    return its RESULT record, or None (its failure printed)."""
    proc = subprocess.run([sys.executable, '-m', 'benchmarks.nmt_loop', flag, mode]
                          + _child_args(args), env=env, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
    if proc.returncode or not lines:
        print('%s repeat %d failed (exit %s): %s' % (mode, rep, proc.returncode,
                                                      proc.stderr.strip()[-2000:]))
        return None
    return json.loads(lines[-1][len('RESULT '):])


def paired_main(args, env):
    """:func:`run_paired` for every mode but float32 and amp, ``args.repeats`` processes each
    (with ``--profile``: one, and the per-operator table of each side, the operators of
    each update profiled on their own)."""
    print('load average at start: %.1f' % os.getloadavg()[0])
    for mode in [m for m in args.modes if m not in ('float32', 'amp')]:
        ratios = []
        for rep in range(args.repeats):
            res = _run_child('--child-paired', mode, rep, args, env)
            if res is None:
                continue
            f32, other = (np.array(res['update_s'][m]) for m in ('float32', mode))
            ratios.extend(f32 / other)
            print('repeat %d float32 %s s/update, %s %s s/update; pair ratios %s; losses %s' % (
                rep, ' '.join('%.2f' % t for t in f32), mode,
                ' '.join('%.2f' % t for t in other), ' '.join('%.2f' % r for r in f32 / other),
                {m: ' '.join('%.3f' % l for l in v[:3]) for m, v in res['loss'].items()}),
                flush=True)
            if res['ops_ms']:
                _print_ops(res['ops_ms'])
        if ratios:
            print('%s: float32 time / %s time, median of %d alternating pairs %.2f (min %.2f, '
                  'max %.2f)' % (mode, mode, len(ratios), np.median(ratios), min(ratios),
                                 max(ratios)))
    print('load average at end: %.1f' % os.getloadavg()[0])
    return 0


def _print_ops(ops_ms, limit=32):
    """A markdown table of ``{mode: {op: ms per update}}``, the largest operators first."""
    modes = list(ops_ms)
    names = sorted(set().union(*ops_ms.values()), key=lambda o: -max(
        ops_ms[m].get(o, 0.0) for m in modes))
    print('| op, ms per update | ' + ' | '.join(modes) + ' |')
    print('|---|' + '---|' * len(modes))
    for op in names[:limit]:
        print('| %s | %s |' % (op, ' | '.join('%.0f' % ops_ms[m][op] if op in ops_ms[m] else '-'
                                             for m in modes)))
    print('| all operators | %s |' % ' | '.join('%.0f' % sum(ops_ms[m].values())
                                                for m in modes))


def _child_args(args):
    out = ['--model', args.model, '--batch-size', str(args.batch_size), '--seq-len',
           str(args.seq_len), '--warmup', str(args.warmup), '--iters', str(args.iters)]
    out += ['--layers', str(args.layers)] if args.layers else []
    out += ['--kernels', args.kernels]
    return out + (['--profile'] if args.profile else [])


if __name__ == '__main__':
    sys.exit(main())
