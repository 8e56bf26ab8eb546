"""The worker side: one mode, one phase, one batch size, in a fresh process.

The parent (:mod:`benchmarks.runner`) starts ``python -m benchmarks.worker --child-spec JSON
--child-result PATH`` once per measurement (``mxnet.contrib.amp.init()`` patches MXNet for the
rest of a process and cannot be undone; peak RSS is per process). The worker writes its result
(a JSON dict) to PATH and exits 0, also when the measurement failed (``status: failed`` and the
first line of the error).
"""
import argparse
import contextlib
import itertools
import json
import logging
import os
import platform
import resource
import sys
import time

import numpy as np

from benchmarks import bert as bench_bert
from benchmarks import flops as bench_flops
from benchmarks import peak as bench_peak
from benchmarks import profile as bench_profile
from benchmarks.modes import LEARNING_RATE, MOMENTUM, SEED, BenchmarkError
from benchmarks.workloads import workload_for

#: contrib.amp modes and whether they keep GluonNLP's attention matmuls and Dropout in float32
#: (benchmarks.bert.FP32_WORKAROUND_OPS).
CONTRIB_AMP_MODES = {'contrib_amp': False, 'contrib_amp_cast_params': False,
                     'contrib_amp_fp32_attention': True}


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
        import mxmp
        self.mx, self.mxmp, self.wl = mx, mxmp, workload_for(spec)
        res['versions'] = dict(self.wl.versions(), mxnet=mx.__version__, mxmp=mxmp.__version__,
                               python=platform.python_version())
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
        res['flop_per_image'] = self.wl.flop_per_sample(self.traced(self.wl.model()))
        res['stage'] = 'build'
        net, step = getattr(self, 'build_%s' % spec['phase'])()
        res['stage'] = 'warmup'
        for _ in range(spec['warmup']):
            step()
            mx.nd.waitall()
        self.count_graph(net)
        if spec['mode'].startswith('mxmp') and 'freeze' not in spec['mode']:
            res['fused'] = self.mxmp._src.gluon.fused_graph(net) is not None
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
        """(tuple of input NDArrays, labels) of ``batch`` samples: the first batch."""
        return self.wl.batches(self.mx, batch, self.ctx)[0]

    def batch_cycle(self, batch):
        """A function returning the workload's batches of ``batch`` samples in turn (one,
        or several of varying length: :meth:`benchmarks.workloads.ImageWorkload.batches`)."""
        batches = self.wl.batches(self.mx, batch, self.ctx)
        self.result['tokens_per_sample'] = self.wl.tokens_per_sample(batches)
        batches = itertools.cycle(batches)
        return lambda: next(batches)

    def new_net(self, dropout=None):
        net = self.wl.model(dropout=dropout)
        self.wl.initialize(net, self.mx, self.ctx)
        return net

    def traced(self, net):
        out = net(*[self.mx.sym.var(n) for n in self.wl.data_names])
        return self.mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out

    def count_graph(self, net):
        """Casts, and the dtypes of the counted layers, of the graph ``net`` runs.

        The graph is the one Gluon cached for the hybridized block (``_cached_graph``, built by
        the warm-up), else a trace of ``net`` with Symbols. ``layer_dtypes`` maps each op of
        :data:`benchmarks.flops.COUNTED_OPS` in the graph to {output dtype: nodes}, inferred
        with float32 inputs.
        """
        res = self.result
        cached = getattr(net, '_cached_graph', None)
        sym = cached[1] if cached else self.traced(net)
        # Gluon names the inputs of its own graph data0, data1, ... (ours: the data names).
        names = [v.name for v in cached[0]] if cached else list(self.wl.data_names)
        res['casts'] = self.mxmp.count_casts(sym)
        from mxmp._src.dtypes import dtype_name
        internals = sym.get_internals()
        try:
            _, out_types, _ = internals.infer_type_partial(**{n: np.float32 for n in names})
        except Exception as err:  # pylint: disable=broad-except  (a diagnostic, not the run)
            res['layer_dtypes'], res['layer_dtypes_error'] = None, first_line(err)
            return
        types = dict(zip(internals.list_outputs(), out_types))
        dtypes = {}
        for node in json.loads(sym.tojson(remove_amp_cast=False))['nodes']:
            if node['op'] in bench_flops.COUNTED_OPS:
                # the first output (mxmp_selfatt_qk with emit_v has a second: the values)
                name = dtype_name(types.get(node['name'] + '_output',
                                            types.get(node['name'] + '_output0'))) or 'unknown'
                per_op = dtypes.setdefault(node['op'], {})
                per_op[name] = per_op.get(name, 0) + 1
        res['layer_dtypes'] = dtypes

    def emulate(self):
        choice = self.spec['emulate']
        if choice == 'auto':
            return not self.result['lp_kernels_available']
        return choice == 'yes'

    def convert_mxmp(self, net, cast_params, fuse_inference='auto', kernels='auto',
                     fold_batchnorm=True):
        """mxmp.convert, timed; cast counts of the graph that runs and of the real graph.
        ``kernels``: the Policy's (``'mxnet'``: MXNet's kernels only)."""
        mxmp, res = self.mxmp, self.result
        emulate = self.emulate()
        res['emulated'] = emulate
        float32_graph = self.traced(net)
        start = time.perf_counter()
        block = mxmp.convert(net, cast_params=cast_params, emulate=emulate,
                             fuse_inference=fuse_inference, fold_batchnorm=fold_batchnorm,
                             policy=mxmp.Policy(self.spec['dtype'], kernels=kernels,
                                                residual_dtype=self.spec.get('residual_dtype',
                                                                             'target')))
        res['conversion_s'] = time.perf_counter() - start
        if emulate:
            res['casts_real_graph'] = mxmp.count_casts(mxmp.convert_symbol(
                float32_graph, self.spec['dtype'], cast_params=cast_params, emulate=False,
                data_names=self.wl.data_names))
        return block

    def float32_kernels(self, net):
        """``net`` (float32) with mxmp's float32 rewrites (:mod:`benchmarks.float32_kernels`),
        timed; ``library_ops``: {library op: nodes} of the graph it runs."""
        from benchmarks.float32_kernels import float32_library_kernels
        start = time.perf_counter()
        block = float32_library_kernels(net, self.wl.data_names)
        self.result['conversion_s'] = time.perf_counter() - start
        ops = {}
        for node in json.loads(block(*[self.mx.sym.var(n) for n in self.wl.data_names])
                               .tojson())['nodes']:
            if node['op'].startswith('mxmp_'):
                ops[node['op']] = ops.get(node['op'], 0) + 1
        self.result['library_ops'] = ops
        return block

    # ------------------------------------------------------------------ training
    def build_train(self):
        mx, mxmp, spec, res = self.mx, self.mxmp, self.spec, self.result
        from mxnet import autograd, gluon
        mode = spec['mode']
        loss_fn = self.wl.loss(gluon)
        opt = {'learning_rate': LEARNING_RATE, 'momentum': MOMENTUM}
        next_batch = self.batch_cycle(spec['batch_size'])
        if mode == 'float32':
            net = self.new_net()
            res['conversion_s'] = 0.0
            trainer = gluon.Trainer(net.collect_params(), 'sgd', opt)
            net.hybridize(static_alloc=True, static_shape=True)

            def backward(loss):
                loss.backward()
        elif mode == 'float32_mxmp_kernels':
            net = self.float32_kernels(self.new_net())
            trainer = gluon.Trainer(net.collect_params(), 'sgd', opt)
            net.hybridize(static_alloc=True, static_shape=True)

            def backward(loss):
                loss.backward()
        elif mode in ('contrib_amp', 'contrib_amp_fp32_attention'):
            from mxnet.contrib import amp
            start = time.perf_counter()
            amp.init(target_dtype=spec['dtype'], fp32_ops=list(bench_bert.FP32_WORKAROUND_OPS)
                     if CONTRIB_AMP_MODES[mode] else None)
            res['conversion_s'] = time.perf_counter() - start
            net = self.new_net()
            res['casts'] = mxmp.count_casts(self.traced(net))  # recounted after the warm-up
            trainer = gluon.Trainer(net.collect_params(), 'sgd', opt)
            amp.init_trainer(trainer)
            net.hybridize(static_alloc=True, static_shape=True)

            def backward(loss):
                with amp.scale_loss(loss, trainer) as scaled:
                    autograd.backward(scaled)
        elif mode in ('mxmp', 'mxmp_cast_params', 'mxmp_mxnet_kernels'):
            net = self.convert_mxmp(self.new_net(), cast_params=mode == 'mxmp_cast_params',
                                    kernels='mxnet' if mode == 'mxmp_mxnet_kernels' else 'auto')
            trainer = mxmp.Trainer(net.collect_params(), 'sgd', opt)
            net.hybridize(static_alloc=True, static_shape=True)

            def backward(loss):
                with trainer.scale_loss(loss) as scaled:
                    scaled.backward()
        else:
            raise BenchmarkError('mode %r has no training phase' % mode)

        def step():
            xs, y = next_batch()
            with autograd.record():
                backward(loss_fn(net(*xs), y))
            trainer.step(spec['batch_size'])
        return net, step

    # ------------------------------------------------------------------ inference
    def build_infer(self):
        mx, mxmp, spec, res = self.mx, self.mxmp, self.spec, self.result
        mode = spec['mode']
        next_batch = self.batch_cycle(spec['batch_size'])
        xs, _ = self.data(spec['batch_size'])
        net = self.new_net()
        hybridize = dict(static_alloc=True, static_shape=True)
        if mode in ('float32', 'float32_fused', 'float32_grad_null'):
            res['conversion_s'] = 0.0
            res['fused'] = mode == 'float32_fused'
            if res['fused']:  # the fastest float32 inference a user can have
                hybridize['backend'] = 'MKLDNN'
            if mode == 'float32_grad_null':   # an inference-only process: no gradient arrays
                net.collect_params().setattr('grad_req', 'null')
        elif mode == 'float32_mxmp_kernels':
            net = self.float32_kernels(net)
        elif mode in CONTRIB_AMP_MODES:
            from mxnet.contrib import amp
            # convert_hybrid_block needs a hybridized block that ran forward once (float32).
            net.hybridize(static_alloc=True, static_shape=True)
            net(*xs)
            mx.nd.waitall()
            # Its fp32_ops takes only ops of its own lists: the nodes by name.
            excluded = bench_bert.workaround_node_names(net._cached_graph[1]) \
                if CONTRIB_AMP_MODES[mode] else None
            start = time.perf_counter()
            net = amp.convert_hybrid_block(
                net, target_dtype=spec['dtype'], ctx=self.ctx, excluded_sym_names=excluded,
                cast_optional_params=mode == 'contrib_amp_cast_params')
            res['conversion_s'] = time.perf_counter() - start
            res['casts'] = mxmp.count_casts(net._cached_graph[1])
        elif mode in ('mxmp', 'mxmp_cast_params', 'mxmp_unfused', 'mxmp_cast_params_unfused',
                      'mxmp_mxnet_kernels', 'mxmp_mxnet_fold'):
            net = self.convert_mxmp(net, cast_params=mode.startswith('mxmp_cast_params'),
                                    fuse_inference=False if mode.endswith('_unfused') else 'auto',
                                    kernels='mxnet' if mode == 'mxmp_mxnet_kernels' else 'auto',
                                    fold_batchnorm=mode != 'mxmp_mxnet_fold')
        elif mode in ('mxmp_freeze', 'mxmp_freeze_unfused'):
            net = self.convert_mxmp(net, cast_params=False,
                                    fuse_inference=False if mode.endswith('_unfused') else 'auto')
            net.hybridize(**hybridize)
            start = time.perf_counter()
            net = mxmp.freeze(net, *xs)   # hybridized with the block's flags, called once
            res['conversion_s'] += time.perf_counter() - start
            res['fused'] = mxmp._src.fused_inference.count_fused(net._cached_graph[1]) > 0
            hybridize = None
        else:
            raise BenchmarkError('mode %r has no inference phase' % mode)
        if hybridize is not None:
            net.hybridize(**hybridize)

        def step():
            net(*next_batch()[0])
        return net, step

    # ------------------------------------------------------------------ loss check
    def loss_check(self):
        """Loss over ``loss_steps`` SGD steps on one batch: float32, mxmp, mxmp cast_params."""
        mx, mxmp, spec, res = self.mx, self.mxmp, self.spec, self.result
        from mxnet import autograd, gluon
        res['lp_kernels_available'] = mxmp.lp_kernels_available(spec['dtype'], self.ctx)
        res['emulated'] = self.emulate()
        res['stage'] = 'build'
        xs, y = self.data(spec['batch_size'])
        loss_fn = self.wl.loss(gluon)
        opt = {'learning_rate': LEARNING_RATE, 'momentum': MOMENTUM}
        initial = os.path.join(spec['output_dir'], 'loss_check_initial.params')
        net = self.new_net(dropout=0.0)  # dropout off: every variant computes one function
        net(*xs)  # finishes the deferred initialisation (shapes come from the first batch)
        net.save_parameters(initial)
        res['losses'] = {}
        for variant in ('float32', 'mxmp', 'mxmp_cast_params'):
            res['stage'] = 'train %s' % variant
            net = self.wl.model(dropout=0.0)
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
                    loss = loss_fn(net(*xs), y).mean()
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


def main(argv=None):
    """``python -m benchmarks.worker --child-spec JSON --child-result PATH``."""
    p = argparse.ArgumentParser(description='One benchmark measurement (started by '
                                'scripts/benchmark.py).')
    p.add_argument('--child-spec', required=True, help='the measurement, as JSON')
    p.add_argument('--child-result', required=True, help='where the result JSON goes')
    args = p.parse_args(argv)
    return child_main(args.child_spec, args.child_result)


if __name__ == '__main__':
    sys.exit(main())
