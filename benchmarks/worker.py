"""The worker side: one mode, one phase, one batch size, in a fresh process.

The parent (:mod:`benchmarks.runner`) starts ``python -m benchmarks.worker --child-spec JSON
--child-result PATH`` once per measurement (``mxnet.contrib.amp.init()`` patches MXNet for the
rest of a process and cannot be undone; peak RSS is per process). The worker writes its result
(a JSON dict) to PATH and exits 0, also when the measurement failed (``status: failed`` and the
first line of the error).
"""
import argparse
import contextlib
import json
import logging
import os
import platform
import resource
import sys
import time

import numpy as np

from benchmarks import flops as bench_flops
from benchmarks import peak as bench_peak
from benchmarks import profile as bench_profile
from benchmarks.modes import LEARNING_RATE, MOMENTUM, SEED, BenchmarkError


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
            res['fused'] = self.mxmp.gluon.fused_graph(net) is not None
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
        # the pass on the traced graph: what the block's first call builds (stem padding adds
        # no cast)
        res['casts'] = mxmp.count_casts(mxmp.convert_symbol(
            float32_graph, self.spec['dtype'], cast_params=cast_params, emulate=emulate))
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
