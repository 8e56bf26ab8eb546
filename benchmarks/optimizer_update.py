"""Time of one SGD momentum update of a model's weights, in the ways MXNet's kernels allow.

``python -m benchmarks.optimizer_update [--model resnet50_v1|bert_base] [--repeats 5]`` prints,
for the float32 weights of the model (random values), the median and minimum milliseconds of
``multi_sgd_mom_update`` with 4 weights per call (MXNET_OPTIMIZER_AGGREGATION_SIZE's default,
what ``mx.optimizer.SGD`` does), with 1 weight per call (what
:class:`mxmp._src.training.updater.Updater` does on a CPU without mxmp's library), of
``sgd_mom_update`` once per weight, and of the library's ``mxmp_multi_sgd_update`` over all
weights in one call (the Updater's pass), each variant's calls alternating with the others'
(interleaved rounds), and for each whether its weights and momenta are bit-identical to the
first's, with the effective memory bandwidth (20 bytes per weight value: weight, gradient
and momentum read, weight and momentum written). The
learning rate and weight decay are values MXNet's scalar float parser (``sgd_mom_update``'s
``lr=``, ``wd=``) rounds one ulp away from float32, to show that difference. Threads:
OMP_NUM_THREADS.
"""
import argparse
import time

import numpy as np

# lr and wd: values the scalar parser rounds 1 ulp off (0.01 and 1e-4 it parses exactly)
SETTINGS = {'lr': 2.2655846366566674e-05, 'momentum': 0.9, 'wd': 3.2772236137436455e-05,
            'rescale_grad': 1 / 16.}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', default='resnet50_v1',
                   help='GluonCV model-zoo name, or bert_base (benchmarks.bert)')
    p.add_argument('--input-size', type=int, default=224)
    p.add_argument('--repeats', type=int, default=5, help='timed calls per variant (median)')
    args = p.parse_args(argv)
    import mxnet as mx
    if args.model.startswith('bert'):
        from benchmarks.bert import bert_inputs, build_bert
        net = build_bert(args.model)
        net.initialize(mx.init.Normal(0.02))
        net(*bert_inputs(mx, args.model, 1, 8, mx.cpu(), np.random.RandomState(0)))
    else:
        from gluoncv.model_zoo import get_model
        net = get_model(args.model, pretrained=False)
        net.initialize()
        net(mx.nd.zeros((1, 3, args.input_size, args.input_size)))
    shapes = [prm.shape for prm in net.collect_params().values() if prm.grad_req != 'null']
    from mxmp._src.kernels.build import load_library
    library = load_library() is not None
    rng = np.random.RandomState(0)
    grads = [mx.nd.array(rng.randn(*s)) for s in shapes]
    start = [mx.nd.array(rng.randn(*s)) for s in shapes]

    def fresh(count=None):
        """Weights, gradients and zero momenta of the first ``count`` weights (all: None)."""
        return ([w.copy() for w in start[:count]], grads[:count],
                [mx.nd.zeros(s) for s in shapes[:count]])

    def single(weights, grads, moms):
        for w, g, m in zip(weights, grads, moms):
            mx.nd.sgd_mom_update(w, g, m, out=w, **SETTINGS)

    def multi(per_call):
        def run(weights, grads, moms):
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

    def one_pass(weights, grads, moms):
        flat = []
        for w, g, m in zip(weights, grads, moms):
            flat += [w, g, m]
        n = len(weights)
        mx.nd.mxmp_multi_sgd_update(*flat, out=weights + moms, num_weights=n,
                                    lrs=(SETTINGS['lr'],) * n, wds=(SETTINGS['wd'],) * n,
                                    with_momentum=1, momentum=SETTINGS['momentum'],
                                    rescale_grad=SETTINGS['rescale_grad'])

    values = sum(int(np.prod(s)) for s in shapes)
    print('%s: %d weights, %.1f M values, float32' % (args.model, len(shapes), values / 1e6))
    variants = [('multi_sgd_mom_update, 4 weights per call', multi(4)),
                ('multi_sgd_mom_update, 1 weight per call', multi(1)),
                ('sgd_mom_update, one weight per call', single)]
    if library:
        variants.append(('mxmp_multi_sgd_update, one call', one_pass))
    # one set of arrays for the timings (BERT-base's would not fit four times in memory); the
    # bit-identity from fresh copies of the first 40 weights, two calls each
    state = fresh()
    times = {name: [] for name, _ in variants}
    for name, fn in variants:   # warm-up
        fn(*state)
    mx.nd.waitall()
    for _ in range(args.repeats):   # interleaved: every variant once per round
        for name, fn in variants:
            begin = time.perf_counter()
            fn(*state)
            mx.nd.waitall()
            times[name].append(time.perf_counter() - begin)
    reference = None
    for name, fn in variants:
        arrays = fresh(40)
        fn(*arrays)
        fn(*arrays)
        out = [a.asnumpy() for a in arrays[0] + arrays[2]]
        reference = out if reference is None else reference
        same = all(np.array_equal(a, b) for a, b in zip(out, reference))
        best = min(times[name])
        print('%-42s %8.1f ms median %8.1f min  %5.1f GB/s  bit-identical to the first: %s'
              % (name, 1e3 * float(np.median(times[name])), 1e3 * best,
                 20 * values / best / 1e9, same))
    rng = np.random.RandomState(0)
    rates = [float(10 ** rng.uniform(-6, 0)) for _ in range(2000)]
    off = sum(_lr_as_read(mx, lr) != np.float32(lr) for lr in rates)
    print("sgd_mom_update's lr= read off np.float32(lr): %d of %d random learning rates in "
          "[1e-6, 1] (multi_sgd_mom_update's lrs=: %d)" % (
              off, len(rates), sum(_lr_as_read(mx, lr, multi=True) != np.float32(lr)
                                   for lr in rates)))
    return 0


def _lr_as_read(mx, lr, multi=False):
    """The learning rate a kernel used: one update of a zero weight and momentum with gradient 1
    and momentum 0.5 leaves momentum = -lr exactly."""
    w, m, g = mx.nd.zeros((1,)), mx.nd.zeros((1,)), mx.nd.ones((1,))
    if multi:
        mx.nd.multi_sgd_mom_update(w, g, m, out=[w], num_weights=1, lrs=(lr,), wds=(0.,),
                                   momentum=0.5)
    else:
        mx.nd.sgd_mom_update(w, g, m, out=w, lr=lr, wd=0., momentum=0.5)
    return -m.asnumpy()[0]


if __name__ == '__main__':
    raise SystemExit(main())
