"""benchmarks.kernel_ops: beside each block's time, the op's own time from MXNet's profiler (its
forward and backward nodes, bulk execution off) and its speed-up from 1 to N threads."""
import json
import os
import subprocess
import sys

import pytest

from benchmarks.kernel_ops import OP_NAMES, SHAPES, combine, op_in_block, op_ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# MXNet 1.9.1's aggregate table of two calls of the library's Dropout graph (abridged from a
# real dump): the rule's training flag is MXNet's Dropout, with no backward node
DUMP = """
Profile Statistics:
\tNote the difference in units for different entries.
Device Storage
=================
Name                          Total Count    Min Use  (kB)    Max Use  (kB)    Avg Use  (kB)
----                          -----------    -------------    -------------    -------------
Memory: cpu/0                           8           0.0000       25165.8242       12582.9121

operator
=================
Name                          Total Count        Time (ms)    Min Time (ms)    Max Time (ms)    Avg Time (ms)
----                          -----------        ---------    -------------    -------------    -------------
mxmp_dropout                            2          20.9900           2.8620          18.1280          10.4950
_copy                                   4           5.1400           1.1260           1.4410           1.2850
_backward_mxmp_dropout                  2           2.1700           1.0320           1.1380           1.0850
SetValueOp                              2           1.2210           0.5960           0.6250           0.6105
Dropout                                 2           0.0180           0.0080           0.0100           0.0090
"""


def test_op_ms_adds_the_forward_and_backward_nodes_only():
    mean, low = op_ms(DUMP, 'dropout', 'mxmp', 2)
    assert mean == pytest.approx((20.99 + 2.17) / 2) and low == pytest.approx(2.862 + 1.032)
    # MXNet's Dropout here is the training flag, without a backward node: no figure
    assert op_ms(DUMP, 'dropout', 'MXNet', 2) is None
    # a node that did not run once per call (another count of calls): no figure
    assert op_ms(DUMP, 'dropout', 'mxmp', 3) is None
    with pytest.raises(ValueError):
        op_ms('not a profile', 'dropout', 'mxmp', 2)
    assert set(OP_NAMES) == set(SHAPES)


def test_processes_combine_to_the_median_and_the_least_minimum():
    assert combine([[3.0, 2.0], [5.0, 1.5], [4.0, 2.5]]) == [4.0, 1.5]
    assert combine([[3.0, 2.0], None]) is None
    assert op_in_block([5.0, 4.0], [1.5, 1.0]) == [3.5, 3.0]


def test_table_has_the_surroundings_the_op_in_block_and_the_op_alone_beside_the_block():
    pytest.importorskip('mxnet')
    from mxmp._src.kernels.build import load_library
    if load_library() is None:
        pytest.skip("mxmp's operator library does not build here")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run([sys.executable, '-m', 'benchmarks.kernel_ops', '--threads', '1', '2',
                           '--calls', '2', '--ops', 'dropout', '--repeats', '2'],
                          capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    head = [c.strip() for c in lines[1].strip('|').split('|')]
    assert head[3:] == ['%s, %s' % (what, col) for what in (
        'block', 'surroundings', 'op in block', 'op alone') for col in (
        '1 thread ms', '2 threads ms', '1 -> 2 threads')]
    res = json.loads(lines[-1])
    assert res['repeats'] == 2 and '2 process(es) per figure' in lines[0]
    assert [len(res['per_process']['float32'][n]['dropout'][k]) for n in ('1', '2')
            for k in ('MXNet', 'mxmp', 'around')] == [2] * 6
    for n in ('1', '2'):
        around = res['results']['float32'][n]['dropout']['around']
        assert len(around) == 2 and 0 < around[1] <= around[0]
        for kernels in ('MXNet', 'mxmp'):
            block = res['results']['float32'][n]['dropout'][kernels]
            alone = res['op_alone']['float32'][n]['dropout'][kernels]
            inside = res['op_in_block']['float32'][n]['dropout'][kernels]
            # both nodes found (no timed comparison: the sum of the nodes' minima is at most
            # their mean by arithmetic)
            assert len(block) == 2 and alone is not None and 0 < alone[1] <= alone[0]
            assert len(inside) == 2 and inside[0] < block[0]
    rows = [[c.strip() for c in line.strip('|').split('|')] for line in lines[3:5]]
    assert [r[2] for r in rows] == ['MXNet', 'mxmp']
    for r in rows:
        assert r[3:9] == [c for c in r[3:9] if c != '-'] and r[14].endswith(')')
        assert 'x (' in r[5] and 'x (' in r[8] and 'x (' in r[14]
