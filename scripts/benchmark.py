#!/usr/bin/env python3
"""Speed, memory and cast counts of mxmp against float32 and ``mxnet.contrib.amp``.

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
* ``contrib_amp``: ``mxnet.contrib.amp``. Training: ``amp.init(target_dtype)`` before the
  network is built, ``amp.init_trainer(trainer)``, ``amp.scale_loss`` inside
  ``autograd.record()``. Inference: ``amp.convert_hybrid_block(net, target_dtype, ctx=ctx)``
  (after one float32 forward, which it requires).
* ``contrib_amp_cast_params`` (inference only): the same with ``cast_optional_params=True``.
* ``mxmp``: ``mxmp.convert(net, target_dtype, cast_params=False)`` + ``mxmp.Trainer``.
* ``mxmp_cast_params``: the same with ``cast_params=True`` (weights stored in the target dtype,
  float32 master weights in the Trainer). mxmp inference is fused by default where the kernels
  exist (``fuse_inference='auto'``; such rows are labelled "(fused)").
* ``mxmp_unfused`` (inference only, run only when named in ``--modes``): ``mxmp`` with
  ``fuse_inference=False``, to measure the fusion lever.

The limit (``benchmarks/peak.py``, ``benchmarks/flops.py``): once per repeat a process measures
the GEMM peak (``--gemm-size`` cubed, default 2048, float32 and the target dtype, same threads);
every row gets its forward FLOP per image, counted from the graph's Convolution and
FullyConnected layers with their inferred shapes, and its percent of the peak of its dtype
(training counted as 3x forward). ``--profile`` replaces the benchmark with a per-operator
training profile of float32, contrib.amp and mxmp side by side (``benchmarks/profile.py``).

The mxmp modes *emulate* the target dtype (float32 kernels, low-precision rounding; see
``mxmp/graph.py``) when ``mxmp.lp_kernels_available(dtype, ctx)`` is False (``--emulate auto``,
the default). Emulated rows are labelled "(emulated)": they measure numerics and the cost of
emulation, not the speed of low-precision kernels. A mode that fails (for example contrib.amp
bfloat16 on a CPU without AVX-512: "could not create a primitive descriptor iterator") is a row
with status ``failed`` and the first line of its error; a failed mode is not re-run in later
repeats (the failure is deterministic; the log of the first attempt is kept).

Per row (phase ``train`` or ``infer``, batch size, mode): throughput in images/s (median, min
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

Examples::

    python scripts/benchmark.py --quick
    python scripts/benchmark.py --model resnet50_v1 --batch-size 1 32 --repeats 3
    python scripts/benchmark.py --dtype float16 --ctx gpu
    python scripts/benchmark.py --profile --batch-size 16 --iters 5
"""
import argparse
import contextlib
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

# The benchmarks/ package (FLOP counting, GEMM peak, profile tables) sits beside scripts/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import flops as bench_flops  # noqa: E402
from benchmarks import memory as bench_memory  # noqa: E402
from benchmarks import peak as bench_peak  # noqa: E402
from benchmarks import profile as bench_profile  # noqa: E402

LOG = logging.getLogger('benchmark')

MODELS = ('resnet50_v1', 'resnet18_v1', 'mobilenetv2_1.0')
#: Mode name -> (label, phases it applies to). Order = order of the rows and of the interleaving.
MODES = {
    'float32': ('float32', ('train', 'infer')),
    'float32_fused': ('float32, oneDNN-fused', ('infer',)),
    'contrib_amp': ('contrib.amp {dtype}', ('train', 'infer')),
    'contrib_amp_cast_params': ('contrib.amp {dtype}, cast_optional_params', ('infer',)),
    'mxmp': ('mxmp {dtype}', ('train', 'infer')),
    'mxmp_cast_params': ('mxmp {dtype}, cast_params', ('train', 'infer')),
    'mxmp_unfused': ('mxmp {dtype}, fuse_inference=False', ('infer',)),
}
#: Modes run unless --modes says otherwise (mxmp_unfused measures the fusion lever: opt-in).
DEFAULT_MODES = [m for m in MODES if m != 'mxmp_unfused']
#: Modes profiled by --profile (training), the first is the reference of the ratios.
PROFILE_MODES = ('float32', 'contrib_amp', 'mxmp')
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
SEED = 0
LEARNING_RATE = 0.01
MOMENTUM = 0.9
#: Environment variables recorded in the JSON and passed unchanged to every subprocess.
THREAD_VARS = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS')


class BenchmarkError(Exception):
    """Bad arguments or an unusable environment; the message names the fix."""


def first_line(err):
    """The first informative line of an exception, as ``Type: message`` (one line, str).

    MXNet errors carry C++ stack traces after the message; only the message is kept.
    """
    lines = [l.strip() for l in str(err).splitlines() if l.strip()]
    lines = [l for l in lines if not l.startswith(('Traceback', 'Stack trace', '[bt]', 'File '))]
    text = lines[0] if lines else ''
    name = type(err).__name__
    return text if text.startswith(name) else '%s: %s' % (name, text)


def rss_mib():
    """Peak resident set size of this process so far, in MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# =============================================================================================
# Child side: one mode, one phase, one batch size, in a fresh process
# =============================================================================================
class _Child:
    """Runs one measurement (``spec`` from the parent) and fills ``self.result``."""

    def __init__(self, spec):
        self.spec = spec
        self.result = {'status': 'running', 'stage': 'import', 'casts': None,
                       'casts_real_graph': None, 'conversion_s': None, 'emulated': False,
                       'iter_s': [], 'img_per_s': []}

    def run(self):
        spec, res = self.spec, self.result
        import mxnet as mx
        import gluoncv
        from gluoncv.model_zoo import get_model
        import mxmp
        self.mx, self.mxmp, self.get_model = mx, mxmp, get_model
        res['versions'] = {'mxnet': mx.__version__, 'gluoncv': gluoncv.__version__,
                           'mxmp': mxmp.__version__, 'python': platform.python_version()}
        res['rss_after_import_mib'] = rss_mib()
        self.ctx = mx.gpu(0) if spec['ctx'] == 'gpu' else mx.cpu()
        mx.random.seed(SEED)
        np.random.seed(SEED)
        if spec['mode'] == 'loss_check':
            return self.loss_check()
        if spec['mode'] == 'peak':
            return self.gemm_peaks()
        res['lp_kernels_available'] = mxmp.lp_kernels_available(spec['dtype'], self.ctx)
        res['stage'] = 'flops'
        res['flop_per_image'] = bench_flops.forward_flops_per_image(
            self.traced(self.get_model(spec['model'], pretrained=False,
                                       classes=spec['classes'])),
            (3, spec['input_size'], spec['input_size']))
        res['stage'] = 'build'
        net, step = getattr(self, 'build_%s' % spec['phase'])()
        res['stage'] = 'warmup'
        for _ in range(spec['warmup']):
            step()
            mx.nd.waitall()
        if spec['mode'].startswith('mxmp'):
            res['fused'] = net.mxmp_fused_symbol is not None
        if spec.get('profile'):
            return self.profile(step)
        res['stage'] = 'timed'
        batch = spec['batch_size']
        for _ in range(spec['iters']):
            start = time.perf_counter()
            step()
            mx.nd.waitall()
            seconds = time.perf_counter() - start
            res['iter_s'].append(seconds)
            res['img_per_s'].append(batch / seconds)
        res['stage'] = 'done'
        res['status'] = 'ok'
        return res

    # ------------------------------------------------------------------ limit, profile
    def gemm_peaks(self):
        """GEMM GFLOP/s in float32 and the target dtype (benchmarks.peak)."""
        res = self.result
        res['stage'] = 'gemm'
        res['peaks'] = {d: bench_peak.measure_gemm_peak(d, self.ctx, size=self.spec['gemm_size'])
                        for d in ('float32', self.spec['dtype'])}
        res['stage'] = 'done'
        res['status'] = 'ok'
        return res

    def profile(self, step):
        """``spec['iters']`` iterations under mx.profiler; keeps its aggregate table."""
        mx, res = self.mx, self.result
        res['stage'] = 'profile'
        res['bulk_env'] = {k: os.environ.get(k) for k in bench_profile.BULK_OFF}
        mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                               filename=os.path.join(self.spec['output_dir'], 'logs',
                                                     'profile_%s.json' % self.spec['mode']))
        mx.profiler.set_state('run')
        start = time.perf_counter()
        for _ in range(self.spec['iters']):
            step()
        mx.nd.waitall()
        res['iter_s'] = [(time.perf_counter() - start) / self.spec['iters']]
        mx.profiler.set_state('stop')
        res['profile_text'] = mx.profiler.dumps(reset=True)
        res['profile_iters'] = self.spec['iters']
        res['stage'] = 'done'
        res['status'] = 'ok'
        return res

    # ------------------------------------------------------------------ shared pieces
    def data(self, batch):
        mx, spec = self.mx, self.spec
        size = spec['input_size']
        x = mx.nd.random.uniform(-1, 1, shape=(batch, 3, size, size), ctx=self.ctx)
        y = mx.nd.array(np.random.randint(0, spec['classes'], size=batch), ctx=self.ctx)
        return x, y

    def new_net(self):
        net = self.get_model(self.spec['model'], pretrained=False, classes=self.spec['classes'])
        net.initialize(self.mx.init.Xavier(magnitude=2), ctx=self.ctx)
        return net

    def traced(self, net):
        return net(self.mx.sym.var('data'))

    def emulate(self):
        choice = self.spec['emulate']
        if choice == 'auto':
            return not self.result['lp_kernels_available']
        return choice == 'yes'

    def convert_mxmp(self, net, cast_params, fuse_inference='auto'):
        """mxmp.convert, timed; cast counts of the graph that runs and of the real graph."""
        mxmp, res = self.mxmp, self.result
        emulate = self.emulate()
        res['emulated'] = emulate
        float32_graph = self.traced(net)
        start = time.perf_counter()
        block = mxmp.convert(net, target_dtype=self.spec['dtype'], cast_params=cast_params,
                             emulate=emulate, fuse_inference=fuse_inference)
        res['conversion_s'] = time.perf_counter() - start
        res['casts'] = mxmp.count_casts(block.mxmp_symbol)
        if emulate:
            res['casts_real_graph'] = mxmp.count_casts(mxmp.convert_symbol(
                float32_graph, self.spec['dtype'], cast_params=cast_params, emulate=False))
        return block

    # ------------------------------------------------------------------ training
    def build_train(self):
        mx, mxmp, spec, res = self.mx, self.mxmp, self.spec, self.result
        from mxnet import autograd, gluon
        mode = spec['mode']
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        opt = {'learning_rate': LEARNING_RATE, 'momentum': MOMENTUM}
        x, y = self.data(spec['batch_size'])
        if mode == 'float32':
            net = self.new_net()
            res['casts'] = mxmp.count_casts(self.traced(net))
            res['conversion_s'] = 0.0
            trainer = gluon.Trainer(net.collect_params(), 'sgd', opt)
            net.hybridize(static_alloc=True, static_shape=True)

            def backward(loss):
                loss.backward()
        elif mode == 'contrib_amp':
            from mxnet.contrib import amp
            start = time.perf_counter()
            amp.init(target_dtype=spec['dtype'])
            res['conversion_s'] = time.perf_counter() - start
            net = self.new_net()
            res['casts'] = mxmp.count_casts(self.traced(net))
            trainer = gluon.Trainer(net.collect_params(), 'sgd', opt)
            amp.init_trainer(trainer)
            net.hybridize(static_alloc=True, static_shape=True)

            def backward(loss):
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
        elif mode in ('mxmp', 'mxmp_cast_params'):
            net = self.convert_mxmp(self.new_net(), cast_params=mode == 'mxmp_cast_params')
            trainer = mxmp.Trainer(net.collect_params(), 'sgd', opt)
            net.hybridize(static_alloc=True, static_shape=True)

            def backward(loss):
                with trainer.scale_loss(loss) as scaled:
                    scaled.backward()
        else:
            raise BenchmarkError('mode %r has no training phase' % mode)

        def step():
            with autograd.record():
                backward(loss_fn(net(x), y))
            trainer.step(spec['batch_size'])
        return net, step

    # ------------------------------------------------------------------ inference
    def build_infer(self):
        mx, mxmp, spec, res = self.mx, self.mxmp, self.spec, self.result
        mode = spec['mode']
        x, _ = self.data(spec['batch_size'])
        net = self.new_net()
        hybridize = dict(static_alloc=True, static_shape=True)
        if mode in ('float32', 'float32_fused'):
            res['casts'] = mxmp.count_casts(self.traced(net))
            res['conversion_s'] = 0.0
            res['fused'] = mode == 'float32_fused'
            if res['fused']:  # the fastest float32 inference a user can have
                hybridize['backend'] = 'MKLDNN'
        elif mode in ('contrib_amp', 'contrib_amp_cast_params'):
            from mxnet.contrib import amp
            # convert_hybrid_block needs a hybridized block that ran forward once (float32).
            net.hybridize(static_alloc=True, static_shape=True)
            net(x)
            mx.nd.waitall()
            start = time.perf_counter()
            net = amp.convert_hybrid_block(
                net, target_dtype=spec['dtype'], ctx=self.ctx,
                cast_optional_params=mode == 'contrib_amp_cast_params')
            res['conversion_s'] = time.perf_counter() - start
            res['casts'] = mxmp.count_casts(net._cached_graph[1])
        elif mode in ('mxmp', 'mxmp_cast_params', 'mxmp_unfused'):
            net = self.convert_mxmp(net, cast_params=mode == 'mxmp_cast_params',
                                    fuse_inference='auto' if mode != 'mxmp_unfused' else False)
        else:
            raise BenchmarkError('mode %r has no inference phase' % mode)
        net.hybridize(**hybridize)

        def step():
            net(x)
        return net, step

    # ------------------------------------------------------------------ loss check
    def loss_check(self):
        """Loss over ``loss_steps`` SGD steps on one batch: float32, mxmp, mxmp cast_params."""
        mx, mxmp, spec, res = self.mx, self.mxmp, self.spec, self.result
        from mxnet import autograd, gluon
        res['lp_kernels_available'] = mxmp.lp_kernels_available(spec['dtype'], self.ctx)
        res['emulated'] = self.emulate()
        res['stage'] = 'build'
        x, y = self.data(spec['batch_size'])
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        opt = {'learning_rate': LEARNING_RATE, 'momentum': MOMENTUM}
        initial = os.path.join(spec['output_dir'], 'loss_check_initial.params')
        net = self.new_net()
        net(x)  # finishes the deferred initialisation (shapes come from the first batch)
        net.save_parameters(initial)
        res['losses'] = {}
        for variant in ('float32', 'mxmp', 'mxmp_cast_params'):
            res['stage'] = 'train %s' % variant
            net = self.get_model(spec['model'], pretrained=False, classes=spec['classes'])
            net.load_parameters(initial, ctx=self.ctx)
            if variant == 'float32':
                trainer = gluon.Trainer(net.collect_params(), 'sgd', opt)
            else:
                net = mxmp.convert(net, spec['dtype'], cast_params=variant == 'mxmp_cast_params',
                                   emulate=res['emulated'])
                trainer = mxmp.Trainer(net.collect_params(), 'sgd', opt)
            net.hybridize(static_alloc=True, static_shape=True)
            losses = []
            for k in range(spec['loss_steps'] + 1):
                with autograd.record():  # training-mode forward (BatchNorm batch statistics)
                    loss = loss_fn(net(x), y).mean()
                    if k < spec['loss_steps']:
                        with (trainer.scale_loss(loss) if variant != 'float32'
                              else contextlib.nullcontext(loss)) as scaled:
                            scaled.backward()
                losses.append(float(loss.asscalar()))
                if k < spec['loss_steps']:
                    trainer.step(1)  # the loss is a mean already
            res['losses'][variant] = losses  # losses[k]: loss after k updates
        os.remove(initial)
        res['stage'] = 'done'
        res['status'] = 'ok'
        return res


def child_main(spec_json, result_path):
    """Entry point of a measurement subprocess: run ``spec``, write the result JSON, exit 0.

    Any exception becomes ``status: failed`` with its first line; the traceback goes to stderr.
    """
    import traceback
    logging.basicConfig(level=logging.WARNING, format='%(name)s: %(message)s')
    child = _Child(json.loads(spec_json))
    try:
        child.run()
    except Exception as err:  # pylint: disable=broad-except  (reported, not hidden)
        traceback.print_exc()
        child.result['status'] = 'failed'
        child.result['error'] = first_line(err)
    child.result['peak_rss_mib'] = rss_mib()
    with open(result_path, 'w') as f:
        json.dump(child.result, f)
    sys.stderr.flush()
    # os._exit: MXNet's engine can hang or crash at interpreter exit after a failed kernel.
    os._exit(0)


# =============================================================================================
# Parent side: plan, run the subprocesses, aggregate, report
# =============================================================================================
def child_env(threads):
    """The environment of every subprocess: the parent's, with the thread counts fixed."""
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = str(threads)
    return env


def run_child(spec, env, log_path, result_path, timeout):
    """Run one subprocess; returns its result dict (a failed one if it crashed or timed out)."""
    if os.path.exists(result_path):
        os.remove(result_path)
    cmd = [sys.executable, os.path.abspath(__file__), '--child-spec', json.dumps(spec),
           '--child-result', result_path]
    start = time.perf_counter()
    with open(log_path, 'w') as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - start
    if rc == 0 and os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
    else:
        with open(log_path) as f:
            tail = [l.strip() for l in f if l.strip()]
        why = 'timed out after %d s' % timeout if rc is None else 'exit code %s' % rc
        result = {'status': 'failed', 'stage': 'process',
                  'error': 'subprocess %s; last log line: %s' % (why, tail[-1] if tail else '')}
    result['wall_s'] = wall
    result['log'] = log_path
    return result


def mode_label(mode, dtype, emulated):
    label = MODES[mode][0].format(dtype=dtype) if mode in MODES else mode
    return label + (' (emulated)' if emulated else '')


def aggregate(runs):
    """One row from the repeats of a (phase, batch, mode): statistics over every timed iteration.

    Returns a dict: status, img_per_s_{median,min,max} (images/s), peak_rss_mib (largest over
    the repeats, MiB), rss_after_import_mib, casts, casts_real_graph, conversion_s (median,
    seconds), emulated, error, repeats (per-repeat median images/s and peak RSS).
    """
    ok = [r for r in runs if r['status'] == 'ok']
    row = {'repeats': [{'status': r['status'],
                        'img_per_s_median': float(np.median(r['img_per_s']))
                        if r.get('img_per_s') else None,
                        'peak_rss_mib': r.get('peak_rss_mib'), 'log': r.get('log')}
                       for r in runs]}
    first = runs[0]
    for key in ('casts', 'casts_real_graph', 'emulated', 'lp_kernels_available', 'versions',
                'flop_per_image', 'fused'):
        row[key] = first.get(key)
    convs = [r['conversion_s'] for r in runs if r.get('conversion_s') is not None]
    row['conversion_s'] = float(np.median(convs)) if convs else None
    if len(ok) < len(runs):
        failed = [r for r in runs if r['status'] != 'ok'][0]
        row.update(status='failed', error=failed.get('error'), failed_stage=failed.get('stage'))
    else:
        row.update(status='ok', error=None)
    if ok:
        speeds = np.concatenate([r['img_per_s'] for r in ok])
        row.update(img_per_s_median=float(np.median(speeds)), img_per_s_min=float(speeds.min()),
                   img_per_s_max=float(speeds.max()), timed_iterations=int(speeds.size),
                   peak_rss_mib=max(r['peak_rss_mib'] for r in ok),
                   rss_after_import_mib=max(r['rss_after_import_mib'] for r in ok))
    else:
        row.update(img_per_s_median=None, img_per_s_min=None, img_per_s_max=None,
                   timed_iterations=0, peak_rss_mib=None, rss_after_import_mib=None)
    if row['status'] == 'failed':
        # Numbers of a partly failed row would be biased: report none.
        row.update(img_per_s_median=None, img_per_s_min=None, img_per_s_max=None)
    return row


def _ratio(a, b):
    return a / b if a is not None and b else None


def add_ratios(rows):
    """Speed and memory ratios against float32, fused float32 and contrib.amp of the same phase
    and batch.

    ``speedup_vs_*`` = median images/s of the row / median images/s of the reference (> 1:
    faster); ``memory_vs_*`` = peak RSS of the row / peak RSS of the reference (< 1: less
    memory). None when either side failed or did not run. The contrib.amp reference is the
    ``contrib_amp`` row; ``*_vs_float32_fused`` exists for inference only (the fused float32
    row is the fastest float32 inference).
    """
    for row in rows:
        peers = {r['mode']: r for r in rows
                 if r['phase'] == row['phase'] and r['batch_size'] == row['batch_size']}
        for ref, key in (('float32', 'float32'), ('contrib_amp', 'contrib_amp'),
                         ('float32_fused', 'float32_fused')):
            other = peers.get(ref, {})
            row['speedup_vs_%s' % key] = _ratio(row.get('img_per_s_median'),
                                                other.get('img_per_s_median'))
            row['memory_vs_%s' % key] = _ratio(row.get('peak_rss_mib'),
                                               other.get('peak_rss_mib'))
    return rows


def loss_summary(result):
    """Final losses of the loss check and their relative difference to float32."""
    if result['status'] != 'ok':
        return {'status': 'failed', 'error': result.get('error'), 'log': result.get('log')}
    losses = result['losses']
    ref = losses['float32']
    out = {'status': 'ok', 'emulated': result['emulated'], 'steps': len(ref) - 1,
           'losses': losses, 'log': result.get('log')}
    for variant, values in losses.items():
        out[variant] = {'initial': values[0], 'final': values[-1],
                        'final_diff_vs_float32': values[-1] - ref[-1],
                        'final_rel_diff_vs_float32': (values[-1] - ref[-1]) / abs(ref[-1])}
    return out


def machine_info(threads):
    """CPU model, AVX-512 flags, core count, load average, thread settings (for the report)."""
    info = {'platform': platform.platform(), 'cpus': os.cpu_count(), 'threads': threads,
            'loadavg_start': os.getloadavg(),
            'env': {k: v for k, v in os.environ.items()
                    if k.startswith(('MXNET_', 'OMP_', 'MKL_', 'KMP_'))}}
    for var in THREAD_VARS:
        info['env'][var] = str(threads)
    try:
        with open('/proc/cpuinfo') as f:
            text = f.read()
        info['cpu_model'] = next((l.split(':', 1)[1].strip() for l in text.splitlines()
                                  if l.startswith('model name')), None)
        flags = next((l.split(':', 1)[1].split() for l in text.splitlines()
                      if l.startswith('flags')), [])
        info['avx512_flags'] = sorted(f for f in set(flags) if f.startswith('avx512'))
    except OSError:
        info['cpu_model'], info['avx512_flags'] = None, None
    return info


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def _fmt(value, spec='%.2f', none='-'):
    return none if value is None else spec % value


def _casts(c):
    return '-' if not c else '%d / %d' % (c['amp_cast'], c['amp_multicast'])


def markdown(report):
    """The Markdown report: configuration, one table of every row, the loss check."""
    cfg, mach = report['config'], report['machine']
    lines = ['# mxmp benchmark: %s, input %dx%d, target dtype %s, %s'
             % (cfg['model'], cfg['input_size'], cfg['input_size'], cfg['dtype'], cfg['ctx']), '',
             '- command: `%s`' % cfg['command'],
             '- machine: %s, %s cores, AVX-512 flags: %s; %s threads (OMP_NUM_THREADS); load '
             'average %.1f at start, %.1f at end'
             % (mach.get('cpu_model'), mach['cpus'], ', '.join(mach.get('avx512_flags') or [])
                or 'none', mach['threads'], mach['loadavg_start'][0], mach['loadavg_end'][0]),
             '- %s kernels on this device (mxmp.lp_kernels_available): %s'
             % (cfg['dtype'], report.get('lp_kernels_available')),
             '- %d warm-up + %d timed iterations per run, %d interleaved repeat(s), one fresh '
             'process per run; total %.0f s' % (cfg['warmup'], cfg['iters'], cfg['repeats'],
                                               report['total_s']), '']
    if any(r.get('emulated') for r in report['rows']):
        lines += ['**Rows marked (emulated) run float32 kernels with %s rounding: they measure '
                  'numerics and the cost of emulation, not %s speed.**' % (cfg['dtype'],
                                                                          cfg['dtype']), '']
    lines += bench_peak.limit_markdown(report.get('peaks') or {}, cfg['dtype'],
                                       report['machine']['threads'])
    head = ('| phase | batch | mode | status | img/s median | min | max | GFLOP/img | '
            '% of peak | x float32 | x fused float32 | x contrib.amp | peak RSS MiB | '
            'RSS x float32 | RSS x contrib.amp | amp_cast / amp_multicast | conversion s |')
    lines += [head, '|' + '---|' * (head.count('|') - 1)]
    for r in report['rows']:
        casts = _casts(r['casts'])
        if r.get('casts_real_graph'):
            casts += ' (real graph: %s)' % _casts(r['casts_real_graph'])
        flop = r.get('flop_per_image')
        percent = r.get('percent_of_peak')
        lines.append('| %s |' % ' | '.join([
            r['phase'], str(r['batch_size']), r['label'],
            'ok' if r['status'] == 'ok' else 'FAILED: %s' % r['error'],
            _fmt(r['img_per_s_median']), _fmt(r['img_per_s_min']), _fmt(r['img_per_s_max']),
            _fmt(flop and flop / 1e9, '%.3f'),
            '-' if percent is None else '%.0f%% of %s' % (percent, r['peak_dtype']),
            _fmt(r['speedup_vs_float32'], '%.2fx'),
            _fmt(r.get('speedup_vs_float32_fused'), '%.2fx'),
            _fmt(r['speedup_vs_contrib_amp'], '%.2fx'),
            _fmt(r['peak_rss_mib'], '%.0f'), _fmt(r['memory_vs_float32'], '%.2fx'),
            _fmt(r['memory_vs_contrib_amp'], '%.2fx'), casts, _fmt(r['conversion_s'], '%.3f')]))
    lines += [''] + bench_memory.memory_markdown(
        bench_memory.memory_split(report['rows']),
        {r['mode']: r['label'] for r in report['rows'] if r['phase'] == 'train'})
    loss = report.get('loss_check')
    if loss:
        lines += ['', '## Training loss on one fixed synthetic batch (batch %d, SGD lr %g, '
                  'momentum %g)' % (cfg['batch_size'][0], LEARNING_RATE, MOMENTUM), '']
        if loss['status'] != 'ok':
            lines.append('FAILED: %s' % loss['error'])
        else:
            lines += ['| run | loss at step 0 | loss after %d steps | final - float32 final | '
                      'relative |' % loss['steps'], '|---|---|---|---|---|']
            for variant in ('float32', 'mxmp', 'mxmp_cast_params'):
                v = loss[variant]
                lines.append('| %s | %.5g | %.5g | %+.3g | %+.1f%% |' % (
                    mode_label(variant, cfg['dtype'], loss['emulated'] and variant != 'float32'),
                    v['initial'], v['final'], v['final_diff_vs_float32'],
                    100 * v['final_rel_diff_vs_float32']))
    rss_import = _fmt(min((r['rss_after_import_mib'] for r in report['rows']
                           if r.get('rss_after_import_mib')), default=None), '%.0f')
    lines += ['', ' '.join([
        'img/s: images per second of one iteration (forward [+ backward + update]);',
        'median/min/max over all timed iterations of all repeats.',
        "GFLOP/img: forward FLOP of one image, counted from the graph's Convolution and",
        'FullyConnected layers with their inferred shapes (2 per multiply-accumulate).',
        '%% of peak: img/s x GFLOP/img (x %d for training: forward + data and weight'
        % bench_flops.TRAIN_FACTOR,
        "gradients) divided by the GEMM peak of the row's dtype measured in this run",
        "(float32 rows: the float32 peak; low-precision rows: the target dtype's; none for",
        'emulated rows).',
        "(fused): inference ran oneDNN's fused graph (mxmp's default where the kernels exist).",
        'x float32 / x fused float32 / x contrib.amp: ratio of median img/s (> 1 is faster).',
        "peak RSS: largest ru_maxrss of the run's process in MiB (includes MXNet itself, about",
        '%s MiB after import); RSS x: ratio of peak RSS (< 1 is less memory).' % rss_import,
        'amp_cast / amp_multicast: cast nodes in the graph that runs. conversion s: amp.init',
        '(contrib.amp training), convert_hybrid_block or mxmp.convert, in seconds.'])]
    return '\n'.join(lines) + '\n'


def chart_phases(rows):
    """The phases that have rows, in PHASES order: one column of panels each (none empty)."""
    return [p for p in PHASES if any(r['phase'] == p for r in rows)]


def bar_chart(report, path):
    """PNG: median images/s (min-max whiskers) and peak RSS (MiB) per phase, batch and mode.

    One column of two panels per phase that has rows (no empty panels). Returns the panel
    titles (list of str).
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    rows, cfg = report['rows'], report['config']
    colors = dict(zip(MODES, plt.get_cmap('tab10').colors))
    phases = chart_phases(rows)
    fig, axes = plt.subplots(2, len(phases), figsize=(6 * len(phases), 7.5), squeeze=False)
    batches = cfg['batch_size']
    for col, phase in enumerate(phases):
        modes = [m for m in MODES if any(r['mode'] == m and r['phase'] == phase for r in rows)]
        width = 0.8 / len(modes)
        for row_i, (key, ylabel) in enumerate((('img_per_s_median', 'images/s (median)'),
                                               ('peak_rss_mib', 'peak RSS (MiB)'))):
            ax = axes[row_i][col]
            top = max([r[key] or 0 for r in rows if r['phase'] == phase] + [1])
            for k, mode in enumerate(modes):
                for b, batch in enumerate(batches):
                    r = next((r for r in rows if (r['phase'], r['batch_size'], r['mode'])
                              == (phase, batch, mode)), None)
                    if r is None:
                        continue
                    x = b + (k - (len(modes) - 1) / 2) * width
                    label = mode_label(mode, cfg['dtype'], r['emulated']) if b == 0 else None
                    value = r[key]
                    if value is None:
                        ax.bar(x, 0, width, color=colors[mode], label=label)
                        ax.text(x, top * 0.02, 'failed', rotation=90, ha='center', va='bottom',
                                fontsize=8, color='red')
                        continue
                    err = None
                    if key == 'img_per_s_median':
                        err = [[value - r['img_per_s_min']], [r['img_per_s_max'] - value]]
                    ax.bar(x, value, width, yerr=err, capsize=2, color=colors[mode], label=label,
                           hatch='//' if r['emulated'] else None, edgecolor='black',
                           linewidth=0.5)
            ax.set_xticks(range(len(batches)))
            ax.set_xticklabels(['batch %d' % b for b in batches])
            ax.set_ylabel(ylabel)
            ax.set_title('%s, %s' % ('training' if phase == 'train' else 'inference', ylabel))
    fig.suptitle('%s %dx%d, %s on %s (hatched: emulated, numerics only; whiskers: min-max)'
                 % (cfg['model'], cfg['input_size'], cfg['input_size'], cfg['dtype'], cfg['ctx']),
                 fontsize=10)
    legend = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc='lower center', ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [ax.get_title() for ax in axes.flat]


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description='Training and inference speed (images/s), peak memory (MiB) and cast counts '
                    'of mxmp vs float32 and mxnet.contrib.amp; one fresh process per run.',
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    p.add_argument('--model', default='resnet50_v1',
                   help='GluonCV model-zoo name: %s; any other name of '
                        'gluoncv.model_zoo.get_model_list() is accepted for smoke tests (e.g. '
                        'cifar_resnet20_v1 with --input-size 32)' % ', '.join(MODELS))
    p.add_argument('--batch-size', type=int, nargs='+', default=[32], help='batch sizes')
    p.add_argument('--input-size', type=int, default=224, help='image height = width (pixels)')
    p.add_argument('--classes', type=int, default=1000, help='output classes of the model')
    p.add_argument('--warmup', type=int, default=3, help='untimed iterations per run (>= 1)')
    p.add_argument('--iters', type=int, default=10, help='timed iterations per run (>= %d)'
                   % MIN_ITERS)
    p.add_argument('--repeats', type=int, default=3,
                   help='interleaved repeats of every mode (A B C A B C ...); one repeat once '
                        'read 0.63x where three read 1.29x on a shared machine')
    p.add_argument('--dtype', default='bfloat16', choices=('bfloat16', 'float16'),
                   help='target dtype (float16 needs --ctx gpu for real kernels)')
    p.add_argument('--ctx', default='cpu', choices=('cpu', 'gpu'),
                   help='device; gpu exits with a message when there is no CUDA GPU')
    p.add_argument('--emulate', default='auto', choices=('auto', 'yes', 'no'),
                   help='mxmp modes: emulate the target dtype in float32 kernels; auto = when '
                        'mxmp.lp_kernels_available(dtype, ctx) is False')
    p.add_argument('--phases', nargs='+', default=list(PHASES), choices=PHASES)
    p.add_argument('--modes', nargs='+', default=DEFAULT_MODES, choices=list(MODES),
                   help='modes to run (float32 is always run: it is the reference; '
                        'mxmp_unfused, inference without fusion, only when named)')
    p.add_argument('--gemm-size', type=int, default=bench_peak.DEFAULT_SIZE,
                   help='M = N = K of the GEMM whose GFLOP/s is the peak (once per repeat, '
                        'float32 and the target dtype); 0 skips it (no %% of peak)')
    p.add_argument('--profile', action='store_true',
                   help='instead of the benchmark: per-operator time of training (mx.profiler, '
                        'bulk execution off) for %s side by side, at the first --batch-size, '
                        'over --iters iterations' % ', '.join(PROFILE_MODES))
    p.add_argument('--loss-steps', type=int, default=20,
                   help='SGD steps of the loss check (0: skip it)')
    p.add_argument('--threads', type=int, default=None,
                   help='OMP_NUM_THREADS/MKL_NUM_THREADS of every run (default: the current '
                        'OMP_NUM_THREADS, else the number of cores)')
    p.add_argument('--timeout', type=float, default=3600, help='seconds per subprocess')
    p.add_argument('--output-dir', default='runs/benchmark', help='where the outputs go')
    p.add_argument('--quick', action='store_true',
                   help='smoke configuration: %s (explicit flags still win)' %
                   ', '.join('%s=%s' % kv for kv in QUICK.items()))
    p.add_argument('--child-spec', help=argparse.SUPPRESS)
    p.add_argument('--child-result', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        given = argv if argv is not None else sys.argv[1:]
        explicit = {a.dest for a in p._actions for s in a.option_strings
                    if any(g == s or g.startswith(s + '=') for g in given)}
        for key, value in QUICK.items():
            if key not in explicit:
                setattr(args, key, value)
    return args


def check_args(args):
    """Raise BenchmarkError for arguments that cannot give a measurement."""
    if args.iters < MIN_ITERS:
        raise BenchmarkError('--iters %d: at least %d timed iterations are needed for a median '
                             'and a spread; pass --iters %d or more' % (args.iters, MIN_ITERS,
                                                                        MIN_ITERS))
    if args.warmup < 1:
        raise BenchmarkError('--warmup %d: the first iteration builds the graph and allocates '
                             'memory, it must not be timed; pass --warmup 1 or more' % args.warmup)
    if args.repeats < 1 or min(args.batch_size) < 1 or args.input_size < 32:
        raise BenchmarkError('--repeats and --batch-size must be >= 1 and --input-size >= 32 '
                             '(the models downsample by 32)')
    if args.loss_steps < 0:
        raise BenchmarkError('--loss-steps must be >= 0')
    if args.model not in MODELS:
        from gluoncv.model_zoo import get_model_list
        if args.model not in get_model_list():
            raise BenchmarkError('--model %s is not in the GluonCV model zoo; use one of %s (or '
                                 'see gluoncv.model_zoo.get_model_list())'
                                 % (args.model, ', '.join(MODELS)))
    if 'float32' not in args.modes:
        args.modes = ['float32'] + list(args.modes)


def gpu_available():
    """Number of CUDA GPUs MXNet sees (0 without CUDA or without a CUDA build)."""
    try:
        import mxnet as mx
        return mx.context.num_gpus()
    except Exception:  # pylint: disable=broad-except  (a CPU build or a missing driver)
        return 0


def main(argv=None):
    args = parse_args(argv)
    if args.child_spec:
        return child_main(args.child_spec, args.child_result)
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(message)s', datefmt='%H:%M:%S')
    try:
        check_args(args)
    except BenchmarkError as err:
        LOG.error('%s', err)
        return 2
    if args.ctx == 'gpu' and not gpu_available():
        LOG.warning('--ctx gpu: MXNet sees no CUDA GPU (no GPU, no driver, or a CPU build of '
                    'MXNet); nothing measured. Run on a GPU machine with mxnet-cu112, or use '
                    '--ctx cpu.')
        return 0
    threads = args.threads or int(os.environ.get('OMP_NUM_THREADS') or os.cpu_count())
    out_dir = os.path.abspath(args.output_dir)
    os.makedirs(os.path.join(out_dir, 'logs'), exist_ok=True)
    env = child_env(threads)
    machine = machine_info(threads)
    config = {k: getattr(args, k) for k in ('model', 'batch_size', 'input_size', 'classes',
                                            'warmup', 'iters', 'repeats', 'dtype', 'ctx',
                                            'emulate', 'phases', 'modes', 'loss_steps', 'quick',
                                            'gemm_size')}
    config['command'] = ' '.join(['python', 'scripts/benchmark.py'] +
                                 (argv if argv is not None else sys.argv[1:]))
    if args.profile:
        return bench_profile.run_profile(config, env, machine, out_dir, args.timeout,
                                         run_child, mode_label, PROFILE_MODES)
    runs = [(phase, batch, mode) for phase in args.phases for batch in args.batch_size
            for mode in MODES if mode in args.modes and phase in MODES[mode][1]]
    LOG.info('%d runs x %d repeats, %d threads each, outputs in %s', len(runs), args.repeats,
             threads, out_dir)
    start = time.perf_counter()
    results = {run: [] for run in runs}
    peak_runs = []
    for repeat in range(args.repeats):
        if args.gemm_size:
            spec = dict(config, mode='peak', phase='-', batch_size=0, output_dir=out_dir,
                        gemm_size=args.gemm_size)
            name = 'gemm_peak_r%d' % repeat
            res = run_child(spec, env, os.path.join(out_dir, 'logs', name + '.log'),
                            os.path.join(out_dir, 'logs', name + '.json'), args.timeout)
            peak_runs.append(res)
            LOG.info('GEMM peak %d^3: %s', args.gemm_size, ', '.join(
                '%s %s' % (d, '%.1f GFLOP/s' % p['gflops_max'] if p['status'] == 'ok'
                           else p['status']) for d, p in res.get('peaks', {}).items())
                     if res['status'] == 'ok' else 'FAILED: %s' % res.get('error'))
        for phase, batch, mode in runs:
            previous = results[(phase, batch, mode)]
            if previous and previous[0]['status'] != 'ok':
                continue  # deterministic failure: not re-run
            spec = dict(config, mode=mode, phase=phase, batch_size=batch, output_dir=out_dir)
            name = '%s_bs%d_%s_r%d' % (phase, batch, mode, repeat)
            res = run_child(spec, env, os.path.join(out_dir, 'logs', name + '.log'),
                            os.path.join(out_dir, 'logs', name + '.json'), args.timeout)
            previous.append(res)
            LOG.info('%-5s batch %-3d %-24s %s', phase, batch, mode + (' (emulated)'
                     if res.get('emulated') else ''),
                     '%.2f img/s median, peak RSS %.0f MiB' % (np.median(res['img_per_s']),
                                                               res['peak_rss_mib'])
                     if res['status'] == 'ok' else 'FAILED: %s' % res.get('error'))
    rows = []
    for (phase, batch, mode), rs in results.items():
        row = aggregate(rs)
        row.update(phase=phase, batch_size=batch, mode=mode,
                   label=mode_label(mode, args.dtype, row['emulated']) +
                   (' (fused)' if row.get('fused') and mode.startswith('mxmp') else ''))
        rows.append(row)
    add_ratios(rows)
    peaks = bench_peak.aggregate_peaks(peak_runs, ('float32', args.dtype)) if peak_runs \
        else {}
    bench_peak.add_percent_of_peak(rows, peaks, args.dtype)
    report = {'config': config, 'machine': machine, 'rows': rows, 'peaks': peaks,
              'lp_kernels_available': next((r['lp_kernels_available'] for r in rows
                                            if r.get('lp_kernels_available') is not None), None)}
    if args.loss_steps:
        spec = dict(config, mode='loss_check', phase='train', batch_size=args.batch_size[0],
                    output_dir=out_dir)
        LOG.info('loss check: %d steps, float32 vs mxmp', args.loss_steps)
        res = run_child(spec, env, os.path.join(out_dir, 'logs', 'loss_check.log'),
                        os.path.join(out_dir, 'logs', 'loss_check.json'), args.timeout)
        report['loss_check'] = loss_summary(res)
    report['total_s'] = time.perf_counter() - start
    machine['loadavg_end'] = os.getloadavg()
    paths = {k: os.path.join(out_dir, 'benchmark.' + k) for k in ('json', 'md', 'png')}
    report['files'] = paths
    with open(paths['json'], 'w') as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(paths['md'], 'w') as f:
        f.write(text)
    bar_chart(report, paths['png'])
    print(text)
    LOG.info('wrote %s', ', '.join(paths.values()))
    return 0


if __name__ == '__main__':
    sys.exit(main())
