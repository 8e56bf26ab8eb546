"""The weight-concatenation rule (mxmp/_src/graph/concat_rule.py): a Concat of parameters alone
runs as ``_npi_concatenate``, whose backward pass keeps no copy of its inputs (MXNet's oneDNN
Concat gradient reads them all), with the same values and gradients bit for bit as MXNet's
Concat; activations keep Concat; ``remove_casts`` gives the float32 graph back exactly."""
import json
import re

import mxnet as mx
import numpy as np
import pytest

import mxmp
from mxmp._src.graph.concat_rule import NP_CONCAT, restore_graph
from mxmp._src.graph.symbol_json import dump, load

HEADS, UNITS, IN, BATCH = 2, 8, 6, 4
WEIGHTS = ('q_weight', 'k_weight', 'v_weight')


def _graph():
    """GluonNLP's self-attention projection (three weights reshaped per head, concatenated,
    one FullyConnected) and a Concat of activations."""
    x = mx.sym.var('data')
    ws = [mx.sym.Reshape(mx.sym.var(n), shape=(HEADS, -1, 0), reverse=True, name=n + '_split')
          for n in WEIGHTS]
    weight = mx.sym.Reshape(mx.sym.Concat(*ws, dim=-2, name='qkv_concat'), shape=(-1, 0),
                            reverse=True)
    h = mx.sym.FullyConnected(x, weight, no_bias=True, num_hidden=3 * UNITS, name='qkv')
    both = mx.sym.Concat(h, mx.sym.relu(h), dim=1, name='act_concat')
    return mx.sym.FullyConnected(both, num_hidden=3, name='out')


def _ops(sym):
    return {n['name']: n['op'] for n in load(sym)['nodes']}


@pytest.mark.parametrize('cast_params', [False, True])
def test_weight_concat_becomes_np_concatenate_and_strips_back(cast_params):
    sym = _graph()
    converted = mxmp.convert_symbol(sym, 'bfloat16', cast_params=cast_params)
    ops = _ops(converted)
    assert ops['qkv_concat'] == NP_CONCAT and ops['act_concat'] == 'Concat'
    assert json.loads(mxmp.remove_casts(converted).tojson(remove_amp_cast=False)) == \
        json.loads(sym.tojson(remove_amp_cast=False))
    again = mxmp.convert_symbol(converted, 'bfloat16', cast_params=cast_params)
    assert again.tojson(remove_amp_cast=False) == converted.tojson(remove_amp_cast=False)


def _bind(sym):
    shapes = {'data': (BATCH, IN)}
    shapes.update({n: (UNITS, IN) for n in WEIGHTS})
    reqs = {n: 'null' if n == 'data' else 'write' for n in sym.list_arguments()}
    return sym.simple_bind(mx.cpu(), grad_req=reqs, **shapes)


def _backward_reads(exe):
    """{backward node: names of the nodes whose outputs it reads} of a bound executor."""
    reads, node = {}, None
    for line in exe.debug_str().splitlines():
        m = re.match(r'^Op:([^,]+), Name=(.*)$', line)
        if m:
            node = m.group(2) if m.group(1).startswith('_backward') else None
            reads.setdefault(node, [])
            continue
        m = re.match(r'^\targ\[\d+\]=(.*)\(\d+\)', line)
        if m and node is not None:
            reads[node].append(m.group(1))
    return reads


@pytest.mark.parametrize('cast_params', [False, True])
def test_backward_pass_keeps_no_copy_of_the_weights(cast_params):
    # MXNet copies a variable's Reshape; its Concat gradient (oneDNN builds) reads those copies,
    # which then live from the forward pass to the backward pass.
    converted = mxmp.convert_symbol(_graph(), 'bfloat16', cast_params=cast_params)
    reads = _backward_reads(_bind(converted))
    readers = sorted(b for b, names in reads.items() if b is not None and
                     any(n.endswith('_split') for n in names))
    assert readers == [], readers
    # the activation Concat still reads its inputs: the check sees what MXNet keeps
    act = [names for b, names in reads.items() if b and b.startswith('act_concat')]
    assert act and 'qkv' in act[0], reads


@pytest.mark.parametrize('cast_params', [False, True])
def test_values_and_gradients_bit_identical_to_mxnet_concat(cast_params):
    emulate = not mxmp.lp_kernels_available('bfloat16')
    converted = mxmp.convert_symbol(_graph(), 'bfloat16', cast_params=cast_params,
                                    emulate=emulate)
    assert NP_CONCAT in _ops(converted).values()
    with_concat = dump(restore_graph(load(converted)))
    assert NP_CONCAT not in _ops(with_concat).values()
    rng = np.random.RandomState(3)
    values = {'data': rng.randn(BATCH, IN)}
    values.update({n: rng.randn(UNITS, IN) for n in WEIGHTS})
    results = []
    for sym in (converted, with_concat):
        exe = _bind(sym)
        for name, arr in exe.arg_dict.items():
            if name not in values:   # the output layer's weight and bias
                values[name] = rng.randn(*arr.shape)
            arr[:] = mx.nd.array(values[name]).astype(arr.dtype)
        out = exe.forward(is_train=True)[0]
        exe.backward(mx.nd.array(np.linspace(-2, 2, out.size).reshape(out.shape)))
        results.append([out.asnumpy()] + [exe.grad_dict[n].astype('float32').asnumpy()
                                          for n in sorted(exe.grad_dict) if n != 'data'])
    for new, old in zip(*results):
        assert np.array_equal(new, old)
    assert any(np.abs(g).sum() > 0 for g in results[0][1:])
