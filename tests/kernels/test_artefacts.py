"""Every file mxmp writes loads in plain MXNet, also where the network runs ops of mxmp's
operator library (LayerNorm, Dropout, softmax with lengths): a converted block's ``export``
(with and without its casts), ``mxmp.freeze(...).export``, ``mxmp convert`` and
``mxmp.Module.save_checkpoint``, ``mxmp.amp.convert_model`` saved by MXNet. Each file is loaded in a fresh process without mxmp
(tests/kernels/plain_mxnet_worker.py) and its outputs are compared with those mxmp computes in
this process. A graph written with ``library_ops=True`` holds the library's ops and loads after
a bare ``import mxmp``.

Tolerance: the library's float32 kernels and MXNet's differ by float32 rounding, which a
bfloat16 cast after them can turn into one bfloat16 step (2**-8 relative) of a value, and the
default ``export`` is the float32 network, compared with the bfloat16 one; outputs are compared
to 2e-2 of their largest magnitude. Measured (seed 0, Zen 4, real kernels): the float32 export
5.4e-3 of the largest output, every converted artefact 0 (bit-identical).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import mxnet as mx
from mxnet.gluon import nn

import mxmp
from mxmp import amp
from mxmp.cli import main as cli_main
from mxmp._src.kernels.build import OPS, load_library

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LIBRARY = load_library() is not None
REAL = mxmp.lp_kernels_available('bfloat16')   # else the written graphs must be emulated
SHAPE = (2, 5, 8)


class _Net(nn.HybridBlock):
    """Dense -> LayerNorm -> Dropout -> softmax with lengths -> Dense."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.fc1 = nn.Dense(16, flatten=False)
            self.ln = nn.LayerNorm()
            self.drop = nn.Dropout(0.1)
            self.fc2 = nn.Dense(4, flatten=False)

    def hybrid_forward(self, F, x, length):  # noqa: N803 (Gluon's F)
        h = self.drop(self.ln(self.fc1(x)))
        h = F.softmax(h, length, axis=-1, use_length=True)
        return self.fc2(h)


def _inputs(seed=0):
    rng = np.random.RandomState(seed)
    return (mx.nd.array(rng.normal(size=SHAPE)),
            mx.nd.array(rng.randint(1, 17, size=SHAPE[:2]), dtype='int32'))


def _net(seed=0):
    mx.random.seed(seed)
    net = _Net(prefix='net_')
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(*_inputs(seed))
    return net


def _ops(path):
    with open(path) as f:
        return {n['op'] for n in json.load(f)['nodes']}


def _plain(tmp_path, cases, import_mxmp=False):
    """Run ``cases`` in a fresh process (plain MXNet unless ``import_mxmp``)."""
    x, length = _inputs()
    np.save(str(tmp_path / 'x.npy'), x.asnumpy())
    np.save(str(tmp_path / 'len.npy'), length.asnumpy())
    for case in cases:
        case.setdefault('inputs', {'data0': str(tmp_path / 'x.npy'),
                                   'data1': str(tmp_path / 'len.npy')})
        case.setdefault('epoch', 0)
        case['import_mxmp'] = import_mxmp
    spec = tmp_path / ('spec_%d.json' % import_mxmp)
    spec.write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    proc = subprocess.run([sys.executable, os.path.join(HERE, 'plain_mxnet_worker.py'),
                           str(spec)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop('mxmp_imported') == import_mxmp
    return out


def _close(got, want):
    want = np.asarray(want, dtype=np.float64)
    assert 'out' in got, got
    got = np.asarray(got['out'])
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), np.abs(got - want).max()


def test_every_artefact_loads_in_plain_mxnet(tmp_path, capsys):
    x, length = _inputs()
    # the float32 files the CLI converts
    _net().export(str(tmp_path / 'fp32'))
    net = _net()
    mxmp.convert(net, 'bfloat16')
    net.hybridize()
    want = net(x, length).asnumpy()
    running = {n['op'] for n in json.loads(
        mxmp.converted_graph(net).tojson(remove_amp_cast=False))['nodes']}
    assert (running >= {'mxmp_layer_norm', 'mxmp_dropout', 'mxmp_softmax'}) == LIBRARY
    net.export(str(tmp_path / 'export'))
    net.export(str(tmp_path / 'casts'), remove_amp_cast=False)

    argv = ['convert', str(tmp_path / 'fp32-symbol.json'), str(tmp_path / 'fp32-0000.params'),
            '--dtype', 'bfloat16', '--data-name', 'data0', '--data-name', 'data1',
            '--out', str(tmp_path / 'cli')] + ([] if REAL else ['--emulate'])
    assert cli_main(argv) == 0
    capsys.readouterr()
    cli_want = mx.gluon.SymbolBlock.imports(str(tmp_path / 'cli-symbol.json'), ['data0', 'data1'],
                                            str(tmp_path / 'cli-0000.params'))(x, length)

    fp32 = mx.sym.load(str(tmp_path / 'fp32-symbol.json'))
    mod = mxmp.Module(fp32, data_names=['data0', 'data1'], label_names=None,
                      target_dtype='bfloat16')
    mod.bind(data_shapes=[mx.io.DataDesc('data0', SHAPE),
                          mx.io.DataDesc('data1', SHAPE[:2], 'int32')], for_training=False)
    _, args, aux = mx.model.load_checkpoint(str(tmp_path / 'fp32'), 0)
    mod.set_params(args, aux)
    mod.forward(mx.io.DataBatch([x, length]), is_train=False)
    mod_want = mod.get_outputs()[0].asnumpy()
    mod.save_checkpoint(str(tmp_path / 'module'), 0, remove_amp_cast=False)

    if REAL:   # contrib.amp's convert_model writes the real graph only
        amp_sym, amp_args, amp_aux = amp.convert_model(fp32, args, aux, 'bfloat16')
        mx.model.save_checkpoint(str(tmp_path / 'amp_model'), 0, amp_sym, amp_args, amp_aux,
                                 remove_amp_cast=False)

    frozen = mxmp.freeze(net, x, length)
    frozen_want = frozen(x, length).asnumpy()
    frozen.export(str(tmp_path / 'frozen'))

    plain = ['export', 'casts', 'cli', 'frozen', 'module'] + (['amp_model'] if REAL else [])
    for name in plain:
        assert not _ops(tmp_path / ('%s-symbol.json' % name)) & set(OPS), name
    got = _plain(tmp_path, [{'name': n, 'prefix': str(tmp_path / n), 'kind': 'checkpoint' if
                             n.startswith(('module', 'amp')) else 'imports'} for n in plain])
    for name, ref in (('export', want), ('casts', want), ('cli', cli_want.asnumpy()),
                      ('frozen', frozen_want), ('module', mod_want), ('amp_model', mod_want)):
        if name in plain:
            _close(got[name], ref)
    if not LIBRARY:
        return

    # asked for (library_ops=True, --library-ops), the files hold the library's ops, and a bare
    # `import mxmp` makes them loadable: the library loads before MXNet parses them
    again = _net()
    mxmp.convert(again, 'bfloat16')
    again(x, length)
    again.export(str(tmp_path / 'casts_lib'), remove_amp_cast=False, library_ops=True)
    assert cli_main(argv + ['--out', str(tmp_path / 'cli_lib'), '--library-ops']) == 0
    capsys.readouterr()
    mod.save_checkpoint(str(tmp_path / 'module_lib'), 0, remove_amp_cast=False,
                        library_ops=True)
    frozen.export(str(tmp_path / 'frozen_lib'), library_ops=True)
    library = {'casts_lib': want, 'frozen_lib': frozen_want, 'module_lib': mod_want,
               'cli_lib': cli_want.asnumpy()}
    for name in library:
        assert 'mxmp_layer_norm' in _ops(tmp_path / ('%s-symbol.json' % name)), name
    got = _plain(tmp_path, [{'name': n, 'prefix': str(tmp_path / n), 'kind': 'checkpoint' if
                             n.startswith('module') else 'imports'} for n in library],
                 import_mxmp=True)
    for name, ref in library.items():
        _close(got[name], ref)


def test_graph_conversion_keeps_its_library_ops_and_mxnet_ops_undoes_them():
    from mxmp._src.graph.kernel_undo import mxnet_ops
    from mxmp._src.graph.symbol_json import load
    x = mx.sym.var('data')
    h = mx.sym.LayerNorm(mx.sym.FullyConnected(x, num_hidden=8, flatten=False, name='fc'),
                         name='ln')
    sym = mx.sym.Dropout(h, p=0.2, name='drop')
    conv = mxmp.convert_symbol(sym, 'bfloat16')
    nodes = load(conv)['nodes']
    assert ('mxmp_layer_norm' in {n['op'] for n in nodes}) == LIBRARY
    plain = mxnet_ops(load(conv))['nodes']
    ops = [n['op'] for n in plain]
    assert not set(ops) & set(OPS) and '_copy' not in ops and '_ones' not in ops
    assert ops.count('Dropout') == 1 and ops.count('LayerNorm') == 1
    ln = [n for n in plain if n['op'] == 'LayerNorm'][0]
    assert [plain[s]['name'] for s, _, _ in ln['inputs']][1:] == ['ln_gamma', 'ln_beta']
