"""Host-side cost of one training step: what runs in Python (or waits on the host) per step.

``OMP_NUM_THREADS=T python -m benchmarks.host_cost --model bert_base --batch-size 8 --seq-len 128
--mode mxmp [--iters 8] [--warmup 3]`` builds the training step of ``scripts/benchmark.py``'s
worker (the same network, data, optimizer and Trainer: SGD, momentum) and prints, in
milliseconds per step (median over ``--iters``) and as a share of a whole step:

* ``step``: a whole step as the benchmark times it (forward, backward, ``trainer.step``, then
  ``waitall``), nothing serialised;
* ``forward+backward``: the same step with a ``waitall`` before ``trainer.step``;
* ``trainer.step (host)``: the Python time of ``trainer.step`` on an idle engine (from its call
  to its return; it only pushes operators, unless it synchronises), in wall clock and in the
  host thread's CPU time (``time.thread_time``: what a loaded machine inflates least);
* ``update (engine)``: from ``trainer.step``'s return to the end of its operators;
* then ``trainer.step``'s host time split by function (cProfile, cumulative time, its share of
  a step): the Trainer's per-parameter loop, the finite check and its synchronisation, the
  optimizer calls, the casts back to the low-precision weights.

One process per call; the figures are wall clock on whatever else the machine runs: pair runs
of two builds (``farm-bench``) and report the load average beside them.
"""
import argparse
import cProfile
import json
import pstats
import statistics
import time

#: (label, function names) whose cumulative time cProfile reports inside ``trainer.step``.
PARTS = (
    ('Trainer._apply_update (all of trainer.step)', ('_apply_update',)),
    ('finite check + sync (Step.check)', ('check',)),
    ('optimizer calls (Updater.__call__)', ('__call__',)),
    ('per-weight kernel pushes (_sgd_update)', ('_sgd_update',)),
    ('weight / dtype checks (runs_single_array)', ('runs_single_array',)),
    ('per-parameter loop: list_data/list_grad', ('list_data', 'list_grad')),
    ('master weights lookup (ParameterMasters.of)', ('of',)),
    ('optimizer call + casts back, per group (_update_group)', ('_update_group',)),
    ('casts: gradient copies and weights back (amp_cast)', ('amp_cast',)),
    ('learning rates / weight decays (_get_lrs, _get_wds)', ('_get_lrs', '_get_wds')),
)


def _spec(args):
    return dict(model=args.model, batch_size=args.batch_size, input_size=args.input_size,
                seq_len=args.seq_len, classes=args.classes, ctx='cpu', dtype='bfloat16',
                emulate='auto', mode=args.mode, phase='train', warmup=args.warmup,
                iters=args.iters, gemm_size=0, loss_steps=0, output_dir='/tmp')


def measure(args):
    """The figures above as a dict (milliseconds, medians)."""
    import mxnet as mx
    from benchmarks.worker import _Child
    from benchmarks.workloads import workload_for
    child = _Child(_spec(args))
    child.mx, child.mxmp, child.wl = mx, __import__('mxmp'), workload_for(child.spec)
    child.ctx = mx.cpu()
    child.result['lp_kernels_available'] = child.mxmp.lp_kernels_available('bfloat16', mx.cpu())
    mx.random.seed(0)
    trainers = []
    classes = [mx.gluon.Trainer] + ([child.mxmp.Trainer] if args.mode != 'float32' else [])
    originals = {cls: cls.step for cls in classes}
    phase = {'serialise': False, 'before': [], 'host': [], 'after': [], 'profile': None,
             'cpu': []}

    def timed_step(self, *a, **k):
        cls = type(self) if type(self) in originals else mx.gluon.Trainer
        trainers.append(self)
        if not phase['serialise']:
            return originals[cls](self, *a, **k)
        t0 = time.perf_counter()
        mx.nd.waitall()
        t1, c1 = time.perf_counter(), time.thread_time()
        if phase['profile'] is not None:
            phase['profile'].enable()
        out = originals[cls](self, *a, **k)
        if phase['profile'] is not None:
            phase['profile'].disable()
        t2, c2 = time.perf_counter(), time.thread_time()
        phase['cpu'].append(c2 - c1)
        mx.nd.waitall()
        t3 = time.perf_counter()
        phase['before'].append(t1 - t0)
        phase['host'].append(t2 - t1)
        phase['after'].append(t3 - t2)
        return out

    for cls in classes:
        cls.step = timed_step
    _, step = child.build_train()
    for _ in range(args.warmup):
        step()
        mx.nd.waitall()
    whole, fwd_bwd = [], []
    for _ in range(args.iters):   # a whole step, then a serialised one, in turn
        phase['serialise'] = False
        start = time.perf_counter()
        step()
        mx.nd.waitall()
        whole.append(time.perf_counter() - start)
        phase['serialise'] = True
        start = time.perf_counter()
        step()
        fwd_bwd.append(time.perf_counter() - start)   # corrected below
    fwd_bwd = [t - h - a for t, h, a in zip(fwd_bwd, phase['host'], phase['after'])]
    profiler = cProfile.Profile()
    phase.update(profile=profiler, host=[], after=[], before=[])
    for _ in range(args.iters):
        step()
    stats = pstats.Stats(profiler)
    n = args.iters
    cumulative = {}
    for (_, _, name), (_, _, _, ct, _) in stats.stats.items():
        cumulative[name] = cumulative.get(name, 0.0) + ct
    ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
    res = {'step_ms': ms(whole), 'fwd_bwd_ms': ms(fwd_bwd), 'host_ms': None,
           'update_engine_ms': None, 'parts_ms': {}, 'iters': n, 'mode': args.mode,
           'trainer': type(trainers[0]).__module__ + '.' + type(trainers[0]).__name__}
    phase['serialise'] = True
    phase.update(profile=None, host=[], after=[], before=[], cpu=[])
    for _ in range(args.iters):
        step()
    res['host_ms'], res['update_engine_ms'] = ms(phase['host']), ms(phase['after'])
    res['host_cpu_ms'] = ms(phase['cpu'])
    res['step_min_ms'] = 1e3 * min(whole)
    for label, names in PARTS:
        res['parts_ms'][label] = 1e3 * sum(cumulative.get(x, 0.0) for x in names) / n
    res['top'] = []
    stats.sort_stats('tottime')
    for (fname, line, name), (_, nc, tt, ct, _) in sorted(
            stats.stats.items(), key=lambda kv: -kv[1][2])[:args.top]:
        res['top'].append(('%s:%d(%s)' % (fname.split('/')[-1], line, name), nc // n,
                           1e3 * tt / n, 1e3 * ct / n))
    return res


def update_only(args):
    """``trainer.step`` alone on the workload's Parameters (random gradients, no forward or
    backward): medians (ms) of its host time (call to return; wall and thread CPU time) and of
    the whole update (call to ``waitall``) over ``args.iters`` calls after ``args.warmup``: the
    A/B of a change to the Trainer's host side, without the noise of the rest of the step.
    ``floor_ms``: two ``elemwise_add`` per float32 weight over its arrays (24 bytes moved per
    value, the SGD momentum update moves 20), the time of streaming them through memory."""
    import numpy as np
    import mxnet as mx
    from benchmarks.worker import _Child
    from benchmarks.workloads import workload_for
    import mxmp
    child = _Child(_spec(args))
    child.mx, child.mxmp, child.wl = mx, mxmp, workload_for(child.spec)
    child.ctx = mx.cpu()
    child.result['lp_kernels_available'] = mxmp.lp_kernels_available('bfloat16', mx.cpu())
    net = child.new_net()
    if args.mode != 'float32':
        net = child.convert_mxmp(net, cast_params=args.mode == 'mxmp_cast_params')
    xs, _ = child.data(args.batch_size)
    net(*xs)
    cls = mx.gluon.Trainer if args.mode == 'float32' else mxmp.Trainer
    trainer = cls(net.collect_params(), 'sgd', {'learning_rate': 1e-4, 'momentum': 0.9})
    rng = np.random.RandomState(0)
    params = [p for p in net.collect_params().values() if p.grad_req != 'null']
    for p in params:
        g = p.grad()
        g[:] = mx.nd.amp_cast(mx.nd.array(rng.randn(*g.shape) * 1e-3), dtype=g.dtype)
    mx.nd.waitall()
    host, total, cpu = [], [], []
    for i in range(args.warmup + args.iters):
        for p in params:
            p.data()._fresh_grad = True
        mx.nd.waitall()
        t0, c0 = time.perf_counter(), time.thread_time()
        trainer.step(args.batch_size)
        t1, c1 = time.perf_counter(), time.thread_time()
        mx.nd.waitall()
        t2 = time.perf_counter()
        if i >= args.warmup:
            host.append(t1 - t0)
            cpu.append(c1 - c0)
            total.append(t2 - t0)
    # the streaming floor: per weight, two adds over the update's arrays (read 4, write 2
    # arrays: 24 bytes per float32 value against the SGD momentum update's 20)
    floor = []
    pairs = [(p.data(), p.grad()) for p in params
             if mxmp._src.dtypes.dtype_name(p.dtype) == 'float32']
    moms = [mx.nd.zeros(w.shape) for w, _ in pairs]
    for i in range(args.warmup + args.iters):
        mx.nd.waitall()
        t0 = time.perf_counter()
        for (w, g), m in zip(pairs, moms):
            mx.nd.elemwise_add(m, g, out=m)
            mx.nd.elemwise_add(w, g, out=w)
        mx.nd.waitall()
        if i >= args.warmup:
            floor.append(time.perf_counter() - t0)
    ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
    return {'update_host_ms': ms(host), 'update_total_ms': ms(total),
            'floor_ms': ms(floor) if floor else None, 'floor_min_ms': 1e3 * min(floor)
            if floor else None, 'values': sum(w.size for w, _ in pairs),
            'update_host_cpu_ms': ms(cpu), 'host_cpu_min_ms': 1e3 * min(cpu),
            'host_min_ms': 1e3 * min(host), 'total_min_ms': 1e3 * min(total),
            'weights': len(params)}


def fused_routes():
    """``[(op, 'ok' or the error's first line)]``: each of MXNet 1.9.1's multi-precision update
    ops (float32 master, momentum and low-precision weight in one kernel) run once on a
    bfloat16 weight, and on a float16 one for comparison."""
    import mxnet as mx
    from mxnet import nd
    from mxnet.contrib.amp.amp import bfloat16
    out = []
    for dtype in ('bfloat16', 'float16'):
        master = nd.array([0.5, -1.5, 2.0, 3.0])
        weight = nd.amp_cast(master, dtype=bfloat16 if dtype == 'bfloat16' else dtype)
        grad = nd.amp_cast(nd.array([0.1, 0.2, -0.3, 0.4]), dtype=weight.dtype)
        state = nd.zeros(4)
        calls = {
            'mp_sgd_update': lambda: nd.mp_sgd_update(weight, grad, master, out=weight, lr=.1),
            'mp_sgd_mom_update': lambda: nd.mp_sgd_mom_update(
                weight, grad, state, master, out=weight, lr=.1, momentum=.9),
            'mp_nag_mom_update': lambda: nd.mp_nag_mom_update(
                weight, grad, state, master, out=weight, lr=.1, momentum=.9),
            'multi_mp_sgd_mom_update': lambda: nd.multi_mp_sgd_mom_update(
                weight, grad, state, master, out=[weight], num_weights=1, lrs=(.1,),
                wds=(0.,), momentum=.9),
            'contrib.mp_adamw_update': lambda: nd.contrib.mp_adamw_update(
                weight, grad, state, nd.zeros(4), master, nd.ones(1), out=weight, lr=.1,
                eta=1.),
            'mp_lamb_update_phase1': lambda: nd.mp_lamb_update_phase1(
                weight, grad, state, nd.zeros(4), master, t=1, wd=0.),
        }
        for name, call in calls.items():
            try:
                call()
                nd.waitall()
                out.append(('%s (%s weight)' % (name, dtype), 'ok'))
            except mx.base.MXNetError as err:
                lines = [l for l in str(err).splitlines() if 'Error' in l] or [str(err)]
                out.append(('%s (%s weight)' % (name, dtype), lines[0].strip()[:120]))
    return out


def report(res):
    """Markdown lines of :func:`measure`'s dict."""
    step = res['step_ms']
    rows = [('step (as the benchmark times it)', step),
            ('forward+backward (waitall before trainer.step)', res['fwd_bwd_ms']),
            ('trainer.step, host (Python until it returns)', res['host_ms']),
            ('trainer.step, host thread CPU time', res['host_cpu_ms']),
            ('trainer.step, engine (return to waitall)', res['update_engine_ms'])]
    rows += [('  ' + k + ' [cProfile]', v) for k, v in res['parts_ms'].items()]
    out = ['%s, %s: ms per step, share of a step' % (res['mode'], res['trainer']), '',
           '| part | ms | share |', '|---|---:|---:|']
    out += ['| %s | %.2f | %.1f%% |' % (k, v, 100 * v / step) for k, v in rows]
    out += ['', 'top functions by own time (calls per step, own ms, cumulative ms):']
    out += ['  %-60s %6d %8.2f %8.2f' % t for t in res['top']]
    return '\n'.join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', default='bert_base')
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--seq-len', type=int, default=None)
    p.add_argument('--input-size', type=int, default=224)
    p.add_argument('--classes', type=int, default=1000)
    p.add_argument('--mode', default='mxmp',
                   choices=('float32', 'mxmp', 'mxmp_cast_params'))
    p.add_argument('--warmup', type=int, default=3)
    p.add_argument('--iters', type=int, default=6)
    p.add_argument('--top', type=int, default=12)
    p.add_argument('--json', help='also write the figures to this file')
    p.add_argument('--update-only', action='store_true',
                   help='instead: time trainer.step alone (random gradients), print JSON')
    p.add_argument('--fused-routes', action='store_true',
                   help='instead: whether MXNet\'s multi-precision update ops (one pass over '
                        'master, momentum and low-precision weight) take bfloat16 weights')
    args = p.parse_args(argv)
    if args.seq_len is None and args.model.startswith('bert'):
        args.seq_len = 128
    if args.update_only:
        print(json.dumps(update_only(args)))
        return
    if args.fused_routes:
        for name, verdict in fused_routes():
            print('%-50s %s' % (name, verdict))
        return
    res = measure(args)
    print(report(res))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(res, f, indent=1)


if __name__ == '__main__':
    main()
