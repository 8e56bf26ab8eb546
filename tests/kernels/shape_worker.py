#!/usr/bin/env python3
"""Worker of tests/kernels/test_unknown_shapes.py: shape inference of converted graphs whose
library ops have inputs of unknown shape, in its own process (the old graphs crashed MXNet
1.9.1's wrapper of library ops), printing one JSON line.

    python tests/kernels/shape_worker.py    # {'partial': infer_shape_partial, converted vs
                                            #  float32; 'module': mxmp.Module against MXNet's;
                                            #  'grid': every op over partly known shapes}
"""
import json
import os
import sys

import numpy as np

import mxnet as mx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import mxmp  # noqa: E402
from mxmp._src.graph.strip import without_library_ops  # noqa: E402
from mxmp._src.kernels.build import load_library  # noqa: E402

FULL = (2, 3, 4, 5)


def _partial(sym, **shapes):
    try:
        args, outs, _ = sym.infer_shape_partial(**shapes)
    except mx.base.MXNetError as err:
        return {'error': ' '.join(str(err).split())[:400]}
    return {'args': sorted((n, list(s)) for n, s in zip(sym.list_arguments(), args)),
            'outs': [list(s) for s in outs]}


def _ops(sym):
    return sorted({n['op'] for n in json.loads(sym.tojson())['nodes']})


def partial():
    """LayerNorm (gamma, beta variables without shape) and softmax with lengths, each before a
    FullyConnected, on 1-D to 4-D data: every combination of known inputs with data known, and
    data unknown."""
    out = {}
    sym = mx.sym
    for ndim in (1, 2, 3, 4):
        shape = FULL[:ndim]
        ln = sym.FullyConnected(sym.LayerNorm(sym.var('x'), sym.var('g'), sym.var('b')),
                                num_hidden=3, name='fc')
        conv = mxmp.convert_symbol(ln, 'bfloat16', data_names=['x'])
        out['ln_ops_%d' % ndim] = _ops(conv)
        out['ln_removed_%d' % ndim] = mxmp.remove_casts(conv).tojson() == ln.tojson()
        # what mxmp writes to files (MXNet's ops): gamma and beta as the user wrote them
        written = json.loads(without_library_ops(conv).tojson())['nodes']
        out['ln_written_%d' % ndim] = sorted(
            sorted(n.get('attrs', {})) for n in written if n['name'] in ('g', 'b'))
        full = {'x': shape, 'g': shape[-1:], 'b': shape[-1:]}
        for known in ('x', 'xg', 'xb', 'xgb'):
            kw = {k: full[k] for k in known}
            out['ln_%d_%s' % (ndim, known)] = [_partial(conv, **kw), _partial(ln, **kw)]
        out['ln_%d_nodata' % ndim] = _partial(conv, g=shape[-1:])
        sm = sym.FullyConnected(sym.softmax(sym.var('x'), sym.var('l'), use_length=True,
                                            axis=-1), num_hidden=3, name='fc')
        conv = mxmp.convert_symbol(sm, 'bfloat16', data_names=['x', 'l'],
                                   data_dtypes={'l': 'int32'})
        out['sm_ops_%d' % ndim] = _ops(conv)
        kw = {'x': shape, 'l': shape[:-1] or (1,)}
        out['sm_%d' % ndim] = [_partial(conv, **kw), _partial(sm, **kw)]
    return out


def module():
    """mxmp.Module (bfloat16) and MXNet's Module (float32) binding data -> LayerNorm -> output
    whose gamma and beta are Symbol variables without shape: outputs and gradients."""
    out = {}
    rng = np.random.RandomState(0)
    for shape in ((6, 8), (2, 3, 8), (2, 2, 3, 8)):
        net = mx.sym.LayerNorm(mx.sym.var('data'), gamma=mx.sym.var('g'),
                               beta=mx.sym.var('b'), name='ln')
        x = mx.nd.array(rng.normal(size=shape) * 3 + 1)
        head = mx.nd.array(rng.normal(size=shape))
        params = {'g': mx.nd.array(rng.uniform(0.5, 2, shape[-1])),
                  'b': mx.nd.array(rng.normal(size=shape[-1]))}
        res = {}
        for name, mod in (('mxmp', mxmp.Module(net, label_names=None, target_dtype='bfloat16')),
                          ('mxnet', mx.mod.Module(net, label_names=None))):
            mod.bind(data_shapes=[('data', shape)], for_training=True)
            mod.set_params({k: v.copy() for k, v in params.items()}, {})
            mod.forward(mx.io.DataBatch([x]), is_train=True)
            mod.backward([head])
            res[name] = [mod.get_outputs()[0].asnumpy()] + [
                mod._exec_group.grad_arrays[i][0].asnumpy()
                for i, n in enumerate(mod._exec_group.param_names)]
            if name == 'mxmp':
                res['ops'] = _ops(mod._exec_group.execs[0]._symbol)
        out[str(len(shape))] = {'ops': res['ops'], 'err': [
            float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
            for a, b in zip(res['mxmp'], res['mxnet'])]}
    return out


def _graphs():
    """name -> (float32 graph, converted graph, its side input or None): each library op's
    MXNet op reading a variable, and reading an op's output (``pre``), before a FullyConnected."""
    sym = mx.sym
    out = {}
    for src in ('var', 'op'):
        x = sym.var('x')
        if src == 'op':
            x = sym.FullyConnected(x, num_hidden=5, flatten=False, no_bias=True, name='pre')
        for op, make, side in (
                ('ln', lambda d: sym.LayerNorm(d, sym.var('gamma'), sym.var('beta')),
                 'gamma'),
                ('do', lambda d: sym.Dropout(d, p=0.3), None),
                ('sm', lambda d: sym.softmax(d, sym.var('l'), use_length=True, axis=-1), 'l')):
            net = sym.FullyConnected(make(x), num_hidden=3, name='fc')
            conv = mxmp.convert_symbol(net, 'bfloat16', data_names=['x', 'l'],
                                       data_dtypes={'l': 'int32'})
            out['%s_%s' % (op, src)] = (net, conv, side)
    return out


def _full(sym, **shapes):
    try:
        args, outs, _ = sym.infer_shape(**shapes)
    except mx.base.MXNetError as err:
        return {'error': ' '.join(str(err).split())[:300]}
    if args is None:   # not every shape known
        return {'incomplete': True}
    return {'args': sorted((n, list(s)) for n, s in zip(sym.list_arguments(), args)),
            'outs': [list(s) for s in outs]}


def grid():
    """infer_shape_partial and infer_shape of every library op's graph (_graphs) over data of 1
    to 4 axes, of unknown shape and with an unknown dimension (0, MXNet's legacy unknown), its
    side input (gamma, lengths) known or not: [converted, float32] per case. A crash of MXNet's
    wrapper of library ops ends this process."""
    out = {}
    datas = {'none': None, '1d': (5,), '2d': (4, 5), '3d': (2, 4, 5), '4d': (2, 3, 4, 5),
             '0dim': (0, 5)}
    for name, (net, conv, side) in _graphs().items():
        out[name + '_ops'] = _ops(conv)
        for dname, shape in datas.items():
            sides = [None]
            if side == 'gamma':
                sides.append((5,))
            elif side == 'l':
                sides.append((shape[:-1] or (1,)) if shape else (4,))
            for k, sshape in enumerate(sides):
                kw = {} if shape is None else {'x': shape}
                if sshape is not None:
                    kw[side] = sshape
                key = '%s|%s|%d' % (name, dname, k)
                out[key] = {'partial': [_partial(conv, **kw), _partial(net, **kw)],
                            'full': [_full(conv, **kw), _full(net, **kw)]}
    # types with the lengths' dtype unknown: MXNet's softmax leaves it unknown
    net = mx.sym.softmax(mx.sym.var('x'), mx.sym.var('l'), use_length=True, axis=-1)
    conv = mxmp.convert_symbol(net, 'bfloat16', data_names=['x', 'l'])
    out['sm_types'] = []
    for sym in (conv, net):
        try:
            args, outs, _ = sym.infer_type_partial(x='float32')
            out['sm_types'].append([[None if t is None else np.dtype(t).name for t in part]
                                    for part in (args, outs)])
        except mx.base.MXNetError as err:
            out['sm_types'].append({'error': ' '.join(str(err).split())[:300]})
    return out


def bind():
    """mxmp.Module (bfloat16) and MXNet's Module (float32) bound with only the data's shape (the
    side inputs' shapes inferred: gamma and beta without shape, lengths as data), forward and
    backward in training: output shapes and gradient shapes, [mxmp, mxnet] per graph."""
    out = {}
    rng = np.random.RandomState(0)
    for name, (net, _, side) in _graphs().items():
        for shape in ((5,), (4, 5), (2, 4, 5)):
            if side == 'l' and len(shape) == 1:   # Module: lengths (1,) are no batch of 5
                continue
            names = ['x', 'l'] if side == 'l' else ['x']
            shapes = [('x', shape)] + ([('l', shape[:-1] or (1,))] if side == 'l' else [])
            data = [mx.nd.array(rng.normal(size=shape))] + (
                [mx.nd.array(rng.randint(0, 6, size=shape[:-1] or (1,)), dtype='int32')]
                if side == 'l' else [])
            res = []
            for mod in (mxmp.Module(net, data_names=names, label_names=None,
                                    target_dtype='bfloat16'),
                        mx.mod.Module(net, data_names=names, label_names=None)):
                try:
                    mod.bind(data_shapes=[mx.io.DataDesc(n, s, dtype='int32' if n == 'l'
                                                         else 'float32') for n, s in shapes],
                             for_training=True)
                    mod.init_params(mx.init.Uniform(0.5))
                    mod.forward(mx.io.DataBatch(data), is_train=True)
                    mod.backward([mx.nd.ones(mod.get_outputs()[0].shape)])
                    res.append({'out': list(mod.get_outputs()[0].shape), 'grads': sorted(
                        (n, list(mod._exec_group.grad_arrays[i][0].shape))
                        for i, n in enumerate(mod._exec_group.param_names))})
                except mx.base.MXNetError as err:
                    res.append({'error': ' '.join(str(err).split())[-300:]})
            out['%s|%d' % (name, len(shape))] = res
    return out


if __name__ == '__main__':
    if load_library() is None:
        print(json.dumps({'library': None}))
        sys.exit(0)
    print(json.dumps({'partial': partial(), 'module': module(), 'grid': grid(),
                      'bind': bind()}))
