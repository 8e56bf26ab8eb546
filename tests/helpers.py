"""Builders and checks shared by several test modules (networks, trainers, graphs)."""
import importlib.util
import json
import os
import signal
import uuid
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, nd
from mxnet.contrib.amp.amp import bfloat16
from mxnet.gluon import nn

import mxmp
from mxmp._src.scaling import DynamicLossScaler
from mxmp._src.training.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]

WORKER = REPO / 'tests' / 'distributed' / 'dist_worker.py'

STEPS, DIST_BATCH, INF_STEP, INF_RANK = 6, 8, 3, 1


def _load_worker():
    spec = importlib.util.spec_from_file_location('dist_worker', WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dist_worker = _load_worker()


# ---------------------------------------------------------------------------- processes
def tagged_pids(tag):
    """PIDs of the live processes whose environment holds ``MXMP_TEST_TAG=tag``."""
    needle = ('MXMP_TEST_TAG=%s' % tag).encode()
    pids = []
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open('/proc/%s/environ' % entry, 'rb') as f:
                env = f.read().split(b'\0')
            with open('/proc/%s/stat' % entry, 'rb') as f:
                state = f.read().rsplit(b')', 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != b'Z':
            pids.append(int(entry))
    return pids


@pytest.fixture
def tag():
    """A unique tag for one job's processes; fails the test if any of them outlives it."""
    value = uuid.uuid4().hex
    yield value
    stray = tagged_pids(value)
    for pid in stray:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not stray, 'processes of the job survived the launcher: %s' % stray


def reference(out_dir, num_shards=2, **kwargs):
    """Single-process training on the concatenated batch of ``num_shards`` workers."""
    return dist_worker.train(str(out_dir / 'init.params'), STEPS, DIST_BATCH, kvstore='none',
                             num_shards=num_shards, inf_step=INF_STEP, inf_rank=INF_RANK,
                             **kwargs)


def dist_initial_params(out_dir, api='gluon'):
    """name -> float32 initial value, named as the records of ``api`` name them."""
    net = dist_worker.make_net()
    net.load_parameters(str(out_dir / 'init.params'))
    values = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
    if api == 'module':   # mlp_fc1_weight -> fc1_weight
        values = {name[len('mlp_'):]: v for name, v in values.items()}
    return values


def param_names(records):
    return sorted({k.split('/', 1)[1] for k in records.files if k.startswith('k0/')})


def relative_error(dist, ref, init, step):
    """||p_dist - p_ref|| / ||p_ref - p_init|| over all Parameters after ``step``."""
    num = den = 0.0
    for name in param_names(dist):
        d = dist['k%d/%s' % (step, name)].astype(np.float64)
        r = ref['params'][step][name].astype(np.float64)
        num += ((d - r) ** 2).sum()
        den += ((r - init[name]) ** 2).sum()
    return np.sqrt(num / den)


def assert_identical_workers(records):
    """Both ranks' records hold the same bytes, but ``loss_sum`` (each rank's own rows)."""
    a, b = records[0], records[1]
    assert sorted(a.files) == sorted(b.files)
    for key in a.files:
        if key == 'loss_sum':
            continue
        assert a[key].dtype == b[key].dtype
        assert a[key].tobytes() == b[key].tobytes(), 'workers differ in %s' % key


def assert_skipped_together(records):
    for rank, rec in records.items():
        assert int(rec['num_workers']) == 2
        expected_applied = [step != INF_STEP for step in range(STEPS)]
        assert rec['applied'].tolist() == expected_applied, rank
        assert rec['skipped_steps'].tolist() == [int(s >= INF_STEP) for s in range(STEPS)]
        scale = rec['loss_scale']
        assert scale[INF_STEP] == scale[INF_STEP - 1] / 2, scale   # halved on the overflow
        assert scale[0] == 2.0 ** 10 and scale[-1] == 2.0 ** 9, scale
        for name in param_names(rec):   # the skipped step changed nothing
            assert np.array_equal(rec['k%d/%s' % (INF_STEP, name)],
                                  rec['k%d/%s' % (INF_STEP - 1, name)])


# ---------------------------------------------------------------------------- training
def assert_matches_one_process(records, tmp_path, tolerance=0.02, **reference_args):
    """Rank 0's steps against one process on the concatenated batch: same applied steps and
    loss scales, parameters within ``tolerance`` relative error of the distance travelled."""
    ref = reference(tmp_path, **reference_args)
    assert ref['applied'] == records[0]['applied'].tolist()
    assert ref['loss_scale'] == records[0]['loss_scale'].tolist()
    init = dist_initial_params(tmp_path)
    for step in range(STEPS):
        assert relative_error(records[0], ref, init, step) < tolerance, step


def assert_float32_matches_one_process(records, tmp_path):
    """float32: rank 0's parameters equal one process's to rtol 1e-5 at every step."""
    ref = reference(tmp_path, dtype='float32')
    for step in range(STEPS):
        for name in param_names(records[0]):
            np.testing.assert_allclose(records[0]['k%d/%s' % (step, name)],
                                       ref['params'][step][name], rtol=1e-5, atol=1e-6)


def small_resnet(seed=0):
    from gluoncv.model_zoo import get_model
    mx.random.seed(seed)
    net = get_model('cifar_resnet20_v1', classes=10)
    net.initialize(mx.init.Xavier())
    return net


def nodes_of(sym):
    return json.loads(sym.tojson(remove_amp_cast=False))['nodes']


def casts(sym):
    """{(cast target dtype, name of the cast tensor's source node)} and the raw count."""
    nodes = nodes_of(sym)
    out = []
    for n in nodes:
        if n['op'] == 'amp_cast':
            src = nodes[n['inputs'][0][0]]
            out.append((n['attrs']['dtype'], src['name']))
    return sorted(out)


def conv_bn_relu_fc_softmax():
    data = mx.sym.var('data')
    x = mx.sym.Convolution(data, kernel=(3, 3), num_filter=8, pad=(1, 1), name='conv')
    x = mx.sym.BatchNorm(x, name='bn')
    x = mx.sym.Activation(x, act_type='relu', name='relu')
    x = mx.sym.FullyConnected(x, num_hidden=10, name='fc')
    return mx.sym.softmax(x, name='softmax')


def run(sym, args, aux=None, ctx=mx.cpu()):
    exe = sym.bind(ctx, args={k: v.copy() for k, v in args.items()},
                   aux_states={k: v.copy() for k, v in (aux or {}).items()})
    return [o.asnumpy() for o in exe.forward(is_train=False)]


def infer_types(sym, **given):
    """{output or argument name: dtype name}, every untyped input taken as float32."""
    from mxmp._src.graph.symbol_json import infer_dtypes as _infer_dtypes
    js = json.loads(sym.tojson(remove_amp_cast=False))
    names = [n['name'] for n in js['nodes']]
    return {names[nid] if k == 0 else '%s:%d' % (names[nid], k): d
            for (nid, k), d in _infer_dtypes(js, given).items()}


def random_args(sym, shapes, seed=0):
    rng = np.random.RandomState(seed)
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    args = {n: nd.array(rng.uniform(-1, 1, s)) for n, s in zip(sym.list_arguments(), arg_shapes)}
    aux = {n: nd.array(rng.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux

EMULATE = not mxmp.lp_kernels_available('bfloat16')

MODULE_BATCH, FEATURES, CLASSES = 32, 12, 4


# ---------------------------------------------------------------------------- helpers
def mlp(hidden=16):
    data = mx.sym.var('data')
    h = mx.sym.Activation(mx.sym.FullyConnected(data, num_hidden=hidden, name='fc1'),
                          act_type='relu', name='relu1')
    out = mx.sym.FullyConnected(h, num_hidden=CLASSES, name='fc2')
    return mx.sym.SoftmaxOutput(out, name='softmax')


def problem(n=256, seed=0):
    """A separable 4-class problem: labels are the argmax of a random linear map."""
    rng = np.random.RandomState(seed)
    x = rng.randn(n, FEATURES).astype(np.float32)
    y = (x @ rng.randn(FEATURES, CLASSES)).argmax(1).astype(np.float32)
    return x, y


def module_initial_params(sym=None, seed=1, batch=MODULE_BATCH):
    """Deterministic float32 parameters for ``sym`` (default: mlp())."""
    sym = mlp() if sym is None else sym
    known = {'data': (batch, FEATURES), 'softmax_label': (batch,)}
    shapes, _, _ = sym.infer_shape(**{k: v for k, v in known.items()
                                      if k in sym.list_arguments()})
    rng = np.random.RandomState(seed)
    return {n: nd.array(rng.uniform(-.5, .5, s)) for n, s in zip(sym.list_arguments(), shapes)
            if n not in ('data', 'softmax_label')}


def batch_of(x, y):
    return mx.io.DataBatch(data=[nd.array(x)], label=[nd.array(y)])


def ready(mod, batch=MODULE_BATCH, momentum=.9, lr=.1, params=None):
    mod.bind(data_shapes=[('data', (batch, FEATURES))],
             label_shapes=[('softmax_label', (batch,))])
    mod.init_params(arg_params=params or module_initial_params(batch=batch), aux_params={})
    mod.init_optimizer(optimizer='sgd',
                       optimizer_params={'learning_rate': lr, 'momentum': momentum})
    return mod


def np_params(mod):
    arg, _ = mod.get_params()
    return {k: v.asnumpy().copy() for k, v in arg.items()}


def device_params(mod):
    """Raw device arrays of every parameter on every context (float32 view of low precision)."""
    group = mod._exec_group
    return {(n, k): nd.amp_cast(a, dtype='float32').asnumpy()
            for n, arrs in zip(group.param_names, group.param_arrays) for k, a in enumerate(arrs)}


def module_optimizer_state(mod):
    out = {}
    for idx, state in mod._updater.states.items():
        out[idx] = None if state is None else state.asnumpy().copy()
    return out, dict(mod._optimizer._index_update_count), mod._optimizer.num_update


def bf16(**kwargs):
    """Module keyword arguments; ``emulate`` follows the probe of the target dtype given (a CPU
    never has float16 kernels, whatever its bfloat16 kernels)."""
    kwargs.setdefault('target_dtype', 'bfloat16')
    kwargs.setdefault('emulate', not mxmp.lp_kernels_available(kwargs['target_dtype']))
    return kwargs

CTXS = [mx.cpu(0), mx.cpu(1)]


def two_layer(dtype, ctxs=CTXS, prefix='nf_'):
    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(CastDense(6, 4), CastDense(3, 6))
    net.initialize(mx.init.Zero(), ctx=ctxs)
    set_random_params(net, 0)
    net.cast(LP_DTYPES[dtype])
    return net


def params(net):
    return [p for _, p in sorted(net.collect_params().items())]


# ---------------------------------------------------------------------------- stuck at floor
def floor_trainer(k):
    net = two_layer('float16', ctxs=[mx.cpu()], prefix='floor_')
    scaler = DynamicLossScaler(init_scale=4.0, min_scale=1.0, max_overflows_at_floor=k)
    return net, Trainer(net.collect_params(), 'sgd', {'learning_rate': .1}, loss_scaler=scaler)


def nan_grad_step(net, trainer, where='grad'):
    x, y = nd.ones((2, 4)), nd.zeros((2, 3))
    with autograd.record():
        loss = ((net(x) - y) ** 2).mean()
        if where == 'loss':
            loss = loss * np.nan
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()
    if where == 'grad':
        params(net)[3].grad()[1, 1] = np.nan     # floor_castdense1_weight
    return trainer.step(2)

LP_DTYPES = {'float16': np.float16, 'bfloat16': bfloat16}


# ---------------------------------------------------------------------------- helpers
class CastDense(gluon.HybridBlock):
    """Dense layer whose weight and bias (any float dtype) are cast to float32 before
    FullyConnected, so that it runs on CPUs without float16/bfloat16 GEMM kernels."""

    def __init__(self, units, in_units, **kwargs):
        super().__init__(**kwargs)
        self._units = units
        with self.name_scope():
            self.weight = self.params.get('weight', shape=(units, in_units))
            self.bias = self.params.get('bias', shape=(units,))

    def hybrid_forward(self, F, x, weight, bias):  # pylint: disable=arguments-differ
        return F.FullyConnected(x, F.amp_cast(weight, dtype='float32'),
                                F.amp_cast(bias, dtype='float32'), num_hidden=self._units)


def set_random_params(net, seed):
    rng = np.random.RandomState(seed)
    for _, param in sorted(net.collect_params().items()):
        param.set_data(nd.array(rng.uniform(-.5, .5, param.shape)))


def cast_mlp(prefix, dtype='float32', seed=0):
    """Two CastDense layers; parameters cast to ``dtype`` (rounding the random values)."""
    net = nn.HybridSequential(prefix=prefix)
    with net.name_scope():
        net.add(CastDense(5, 4), CastDense(3, 5))
    net.initialize(mx.init.Zero())
    set_random_params(net, seed)
    if dtype != 'float32':
        net.cast(LP_DTYPES[dtype])
    return net


def f32(arr):
    """Float32 numpy copy of an NDArray of any float dtype (bfloat16 via amp_cast)."""
    return nd.amp_cast(arr, dtype='float32').asnumpy()


def params_of(net):
    return [p for _, p in sorted(net.collect_params().items())]


def optimizer_state(trainer):
    """Numpy copies of every optimizer state array of every device, plus update counts."""
    out = []
    for updater in trainer._updaters:
        for idx in sorted(updater.states):
            state = updater.states[idx]
            flat = state if isinstance(state, (list, tuple)) else [state]
            out.extend(s.asnumpy() for s in flat if s is not None)
    counts = {k: dict(v) for k, v in trainer._optimizer._all_index_update_counts.items()}
    return out, counts, trainer._optimizer.num_update


def linear_batches(n, seed=3):
    """Data for the loss sum(c * (x W^T + b)) of one linear layer: the gradients c^T x and
    sum(c) do not depend on the weights and are small integers, exactly representable in
    float16 and bfloat16, so low-precision and float32 training see the same gradients."""
    rng = np.random.RandomState(seed)
    return [(nd.array(rng.randint(-2, 3, (4, 4))), nd.array(rng.randint(-1, 2, (4, 3))))
            for _ in range(n)]


def linear_backward(net, trainer, x, c):
    with autograd.record():
        loss = (net(x) * c).sum()
        with trainer.scale_loss(loss) as scaled:
            scaled.backward()


# ---------------------------------------------------------------------------- checkpoints
def trained_bf16_trainer(prefix, steps=3, skip=True):
    net = cast_mlp(prefix, 'bfloat16')
    trainer = Trainer(net.collect_params(), 'sgd', {'learning_rate': .05, 'momentum': .9},
                      loss_scaler=DynamicLossScaler(init_scale=2.**6, growth_interval=4))
    data = linear_batches(steps + 1)
    for k, (x, c) in enumerate(data):
        linear_backward(net, trainer, x, c)
        if skip and k == 1:
            params_of(net)[0].grad()[0] = np.inf
        trainer.step(4)
    return net, trainer


def fresh_trainer(prefix='lp_', **kwargs):
    net = cast_mlp(prefix, 'bfloat16')
    kwargs.setdefault('loss_scaler', DynamicLossScaler(init_scale=2.**6, growth_interval=4))
    return net, Trainer(net.collect_params(), 'sgd', {'learning_rate': .05, 'momentum': .9},
                        **kwargs)
