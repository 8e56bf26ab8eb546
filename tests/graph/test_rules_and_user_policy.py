"""The pass's rewriting rules (the kernel rule, the reduction rule) against the user's policy
and the context: an op the user names in ``lp_ops`` keeps the user's class and MXNet's op, one
named in ``fp32_ops`` runs the library's float32 kernel and explain names both; a GPU context
gets no library op (CPU kernels only); with ``MXNET_EXEC_ENABLE_ADDTO`` the warning names every
op that keeps MXNet's kernel, once per process; explain never builds or loads the library.
"""
import json
import logging
import os
import subprocess
import sys
import textwrap

import mxnet as mx
import pytest

import mxmp
from mxmp._src.graph import kernel_rule
from mxmp._src.graph.symbol_json import load
from mxmp._src.kernels.build import NO_BACKWARD_OPS, OPS, load_library

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMES = ['data', 'valid_length']
DTYPES = {'valid_length': 'int32'}


def _graph():
    """FullyConnected -> LayerNorm -> Dropout -> softmax with lengths -> sum over the last axis."""
    h = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8, flatten=False, name='fc')
    h = mx.sym.Dropout(mx.sym.LayerNorm(h, name='ln'), p=0.1, name='drop')
    h = mx.sym.softmax(h, mx.sym.var('valid_length'), axis=-1, use_length=True, name='sm')
    return mx.sym.sum(h, axis=-1, name='total')


def _convert(policy):
    return load(mxmp.convert_symbol(_graph(), policy=policy, data_names=NAMES,
                                    data_dtypes=DTYPES))['nodes']


def _explain(policy):
    return {r.name: r for r in mxmp.explain(_graph(), policy=policy, data_names=NAMES,
                                            data_dtypes=DTYPES)}


def test_ops_in_lp_ops_keep_the_users_class_and_mxnet_ops():
    policy = mxmp.Policy('bfloat16', lp_ops=['LayerNorm', 'Dropout', 'sum'])
    rows = _explain(policy)
    for name, op in (('ln', 'LayerNorm'), ('drop', 'Dropout'), ('total', 'sum')):
        assert (rows[name].op, rows[name].dtype) == (op, 'bfloat16'), rows[name]
        assert rows[name].rule.startswith('lp_ops (user override)'), rows[name]
    assert "the kernel rule keeps MXNet's LayerNorm" in rows['ln'].rule
    assert "the reduction rule keeps MXNet's sum" in rows['total'].rule
    nodes = _convert(policy)
    ops = [n['op'] for n in nodes]
    # no rule rewrote the user's ops (softmax, not named, runs the library's kernel if built)
    assert not set(ops) & {'mxmp_layer_norm', 'mxmp_dropout'} and ops.count('FullyConnected') == 1
    # MXNet types the user's ops bfloat16 in the converted graph
    sym = mxmp.convert_symbol(_graph(), policy=policy, data_names=NAMES, data_dtypes=DTYPES)
    internals = sym.get_internals()
    _, out_types, _ = internals.infer_type(data='float32', valid_length='int32')
    types = dict(zip(internals.list_outputs(), out_types))
    for name in ('ln_output', 'drop_output', 'total_output'):
        assert 'bfloat16' in str(types[name]), (name, types[name])


def test_ops_in_fp32_ops_run_the_library_kernel_and_explain_names_both():
    rows = _explain(mxmp.Policy('bfloat16', fp32_ops=['LayerNorm', 'sum']))
    assert rows['ln'].op == 'mxmp_layer_norm' and rows['ln'].dtype == 'float32'
    assert rows['ln'].rule.startswith('fp32_ops (user override); kernel rule: LayerNorm as '
                                      'mxmp_layer_norm')
    assert rows['total'].rule.startswith('fp32_ops (user override); reduction rule')
    assert rows['drop'].rule.startswith('kernel rule: Dropout as mxmp_dropout')   # not named
    if load_library() is not None:
        ops = [n['op'] for n in _convert(mxmp.Policy('bfloat16', fp32_ops=['LayerNorm']))]
        assert 'mxmp_layer_norm' in ops and 'LayerNorm' not in ops


def test_a_gpu_context_gets_no_library_op(monkeypatch):
    # by graph structure: no GPU is needed. Without CUDA in the build the kernel probe of
    # gpu(0) raises GpuProbeError (test_device.py), so the probe answers as a GPU whose
    # bfloat16 kernels are missing would (Policy.on emulates there).
    from mxmp._src import device
    real = device.lp_kernels_available
    monkeypatch.setattr(device, 'lp_kernels_available',
                        lambda dtype, ctx=None: False if ctx is not None and
                        ctx.device_type == 'gpu' else real(dtype, ctx))
    on_gpu = mxmp.Policy('bfloat16').on(mx.gpu(0))
    assert on_gpu.kernels == 'mxnet'
    ops = [n['op'] for n in _convert(on_gpu)]
    assert not set(ops) & set(OPS) and {'LayerNorm', 'Dropout', 'softmax'} <= set(ops)
    assert not set(_explain(on_gpu)[n].op for n in ('ln', 'drop', 'sm')) & set(OPS)
    assert mxmp.Policy('bfloat16').on(mx.cpu()).kernels == 'auto'
    from mxmp._src.training.module_parts import module_policy
    _, policy, _, _ = module_policy('bfloat16', None, None, 'auto', [mx.cpu(), mx.gpu(0)])
    assert policy.kernels == 'mxnet'
    if load_library() is not None:
        # the graph has no attention matmul and no GELU: the library's other three graph ops
        # (the optimizer update runs outside graphs)
        assert set(OPS) - set(kernel_rule.ATTENTION.values()) - set(NO_BACKWARD_OPS) - {
            'mxmp_gelu'} <= {
            n['op'] for n in _convert(mxmp.Policy('bfloat16').on(mx.cpu()))}


def test_addto_warning_names_every_op_once(monkeypatch, caplog):
    monkeypatch.setenv('MXNET_EXEC_ENABLE_ADDTO', '1')
    monkeypatch.setattr(kernel_rule, '_ADDTO_SAID', set(), raising=False)   # said before
    with caplog.at_level(logging.WARNING, logger='mxmp.kernels'):
        for _ in range(2):
            ops = [n['op'] for n in _convert(mxmp.Policy('bfloat16'))]
            assert not set(ops) & set(OPS)
    said = [r.getMessage() for r in caplog.records if 'MXNET_EXEC_ENABLE_ADDTO' in r.getMessage()]
    assert len(said) == 1, said
    for op in ('LayerNorm', 'Dropout', 'softmax (with lengths)'):
        assert op in said[0], said


def test_explain_never_builds_or_loads_the_library(tmp_path):
    code = textwrap.dedent('''
        import json, os, mxnet as mx, mxmp
        x = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
        rows = mxmp.explain(mx.sym.LayerNorm(x, name='ln'), 'bfloat16')
        row = [r for r in rows if r.name == 'ln'][0]
        print(json.dumps([row.op, row.rule,
                          'mxmp_layer_norm' in mx.operator.get_all_registered_operators(),
                          os.path.exists(os.environ['MXMP_KERNEL_CACHE'])]))
    ''')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=ROOT,
                                                MXMP_KERNEL_CACHE=str(tmp_path / 'cache')))
    assert proc.returncode == 0, proc.stderr[-2000:]
    op, rule, registered, cache = json.loads(proc.stdout.strip().splitlines()[-1])
    assert op == 'mxmp_layer_norm' and rule.startswith('kernel rule: LayerNorm as mxmp_layer_norm')
    assert not registered and not cache   # nothing built (the cache is empty), nothing loaded
