"""``python -m benchmarks.backward_kept``: what a training graph keeps from its forward pass for
the backward pass.

Pinned: the parser reads every node's inputs from MXNet's own ``Executor.debug_str()`` (a
backward FullyConnected reads its data and weight, ReLU's backward its output; forward nodes
and variables are told apart by name); hidden outputs are sized as MXNet makes them (LayerNorm's
mean and standard deviation: the data's shape with the normalized axis 1, float32; Dropout's
mask: the data's); and the whole command on the smoke BERT sums what it prints (the by-dtype
line adds up to the headline total, bfloat16 entries only in the converted graph and only where
``mxmp.lp_kernels_available('bfloat16')``: emulation holds bfloat16 tensors in float32).
"""
import re

import mxnet as mx
import pytest

import mxmp
from benchmarks import backward_kept


def _two_layers():
    x = mx.sym.var('data')
    h = mx.sym.FullyConnected(x, num_hidden=4, name='fc1')
    a = mx.sym.Activation(h, act_type='relu', name='act')
    return mx.sym.FullyConnected(a, num_hidden=3, name='fc2')


def test_parser_reads_what_each_backward_node_reads():
    exe = _two_layers().simple_bind(mx.cpu(), data=(2, 5))
    nodes = {name: (op, ins) for op, name, ins in
             backward_kept.parse_debug_str(exe.debug_str())}
    assert nodes['fc1'] == ('FullyConnected', [('data', 0), ('fc1_weight', 0), ('fc1_bias', 0)])
    op, ins = nodes['act_backward']
    assert op == '_backward_Activation' and ('act', 0) in ins   # ReLU's backward reads its output
    op, ins = nodes['fc2_backward']
    assert op == '_backward_FullyConnected'
    assert ('act', 0) in ins and ('fc2_weight', 0) in ins       # data and weight, not the bias
    assert ('fc2_bias', 0) not in ins


def test_entry_table_gives_each_forward_output_its_shape_and_dtype():
    table, graph = backward_kept.entry_table(_two_layers(), {'data': (2, 5)},
                                             {'data': 'float32'})
    assert table[('act', 0)] == ('Activation', (2, 4), 'float32', 4)
    assert table[('fc2', 0)] == ('FullyConnected', (2, 3), 'float32', 4)
    assert table[('data', 0)][0] == 'null'
    assert [n['name'] for n in graph['nodes']][-1] == 'fc2'


def test_hidden_outputs_have_mxnets_shapes():
    by_name = {'ln': {'attrs': {'axis': '-1'}}, 'drop': {}, 'other': {}}
    first = ('LayerNorm', (8, 16, 32), 'bfloat16', 2)
    assert backward_kept.hidden_output(('ln', 1), first, by_name) == (
        'LayerNorm', (8, 16, 1), 'float32', 4)
    mask = ('Dropout', (4, 6), 'float32', 4)
    assert backward_kept.hidden_output(('drop', 1), mask, by_name) == mask
    assert backward_kept.hidden_output(('other', 1), ('Concat', (3,), 'float32', 4),
                                       by_name) == ('Concat', (), '?', 0)


@pytest.mark.parametrize('mode', ['float32', 'mxmp'])
def test_the_command_on_the_smoke_bert_adds_up(mode, capsys):
    pytest.importorskip('gluonnlp', reason='the BERT models need the optional extra: '
                        'pip install -e .[bert]')
    assert backward_kept.main(['--model', 'bert_tiny', '--batch-size', '2', '--seq-len', '16',
                               '--mode', mode, '--top', '2']) == 0
    out = capsys.readouterr().out
    head = re.search(r'kept for the backward pass ([\d.]+) MiB in (\d+) entries', out)
    assert head and int(head.group(2)) > 10
    by_dtype = dict((k, float(v)) for k, v in
                    re.findall(r'(\w+) ([\d.]+)', out.split('by dtype: ')[1].splitlines()[0]))
    assert abs(sum(by_dtype.values()) - float(head.group(1))) <= 0.1
    assert ('bfloat16' in by_dtype) == (mode == 'mxmp' and mxmp.lp_kernels_available('bfloat16'))
    assert "executor's memory plan" in out
    assert len(re.findall(r'MiB \w+ \S+\(\d+\) read by _backward_', out)) == 2
