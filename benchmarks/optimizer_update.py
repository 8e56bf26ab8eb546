"""Time of one SGD momentum update of a model's weights: MXNet's aggregated kernel against the
single-array one that :class:`mxmp.training.updater.Updater` runs on a CPU.

``python -m benchmarks.optimizer_update [--model resnet50_v1] [--repeats 5]`` prints, for the
float32 weights of the model (random values), the median milliseconds of ``sgd_mom_update``
called once per weight and of ``multi_sgd_mom_update`` with 1 and with 4 weights per call
(4 = MXNET_OPTIMIZER_AGGREGATION_SIZE's default, what ``mx.optimizer.SGD`` uses), and whether
the two kernels give bit-identical weights and momenta. Threads: OMP_NUM_THREADS.
"""
import argparse
import time

import numpy as np

SETTINGS = {'lr': 0.01, 'momentum': 0.9, 'wd': 1e-4, 'rescale_grad': 1 / 16.}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', default='resnet50_v1', help='GluonCV model-zoo name')
    p.add_argument('--input-size', type=int, default=224)
    p.add_argument('--repeats', type=int, default=5, help='timed calls per variant (median)')
    args = p.parse_args(argv)
    import mxnet as mx
    from gluoncv.model_zoo import get_model
    net = get_model(args.model, pretrained=False)
    net.initialize()
    net(mx.nd.zeros((1, 3, args.input_size, args.input_size)))
    shapes = [prm.shape for prm in net.collect_params().values() if prm.grad_req != 'null']
    rng = np.random.RandomState(0)
    grads = [mx.nd.array(rng.randn(*s)) for s in shapes]
    start = [mx.nd.array(rng.randn(*s)) for s in shapes]

    def fresh():
        return [w.copy() for w in start], [mx.nd.zeros(s) for s in shapes]

    def single(weights, moms):
        for w, g, m in zip(weights, grads, moms):
            mx.nd.sgd_mom_update(w, g, m, out=w, **SETTINGS)

    def multi(per_call):
        def run(weights, moms):
            for i in range(0, len(weights), per_call):
                flat = []
                for w, g, m in zip(weights[i:i + per_call], grads[i:i + per_call],
                                   moms[i:i + per_call]):
                    flat += [w, g, m]
                n = len(flat) // 3
                mx.nd.multi_sgd_mom_update(*flat, out=weights[i:i + per_call], num_weights=n,
                                           lrs=[SETTINGS['lr']] * n, wds=[SETTINGS['wd']] * n,
                                           momentum=SETTINGS['momentum'],
                                           rescale_grad=SETTINGS['rescale_grad'])
        return run

    def timed(fn):
        weights, moms = fresh()
        fn(weights, moms)  # warm-up
        mx.nd.waitall()
        times = []
        for _ in range(args.repeats):
            begin = time.perf_counter()
            fn(weights, moms)
            mx.nd.waitall()
            times.append(time.perf_counter() - begin)
        return 1e3 * float(np.median(times)), weights, moms

    print('%s: %d weights, %.1f M values, float32' % (
        args.model, len(shapes), sum(int(np.prod(s)) for s in shapes) / 1e6))
    results = {}
    for name, fn in [('sgd_mom_update, one weight per call', single),
                     ('multi_sgd_mom_update, 1 weight per call', multi(1)),
                     ('multi_sgd_mom_update, 4 weights per call', multi(4))]:
        ms, weights, moms = timed(fn)
        results[name] = [a.asnumpy() for a in weights + moms]
        print('%-42s %8.1f ms' % (name, ms))
    first, *rest = results.values()
    same = all(np.array_equal(a, b) for other in rest for a, b in zip(first, other))
    print('weights and momenta bit-identical across the variants: %s' % same)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
