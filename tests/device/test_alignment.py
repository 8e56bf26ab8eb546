"""mxmp.check_alignment: Tensor Core (multiple of 8) sizes of Convolution/FullyConnected layers."""
import mxnet as mx
import pytest
from mxnet import gluon

import mxmp
from mxmp._src.alignment import Misalignment, check_alignment, format_alignment


def misaligned_net():
    """Known problems: conv0 3->12 channels, conv1 groups of 3->4, conv2 depthwise, deconv -> 6
    channels, dense0 10 outputs; dense1 is aligned except for the batch."""
    net = gluon.nn.HybridSequential(prefix='net_')
    with net.name_scope():
        net.add(gluon.nn.Conv2D(12, 3, padding=1),              # conv0: C=3, K=12
                gluon.nn.Conv2D(16, 3, padding=1, groups=4),    # conv1: 3 and 4 per group
                gluon.nn.Conv2D(16, 3, padding=1, groups=16),   # conv2: depthwise
                gluon.nn.Conv2DTranspose(6, 2, strides=2),      # conv3: K=6, 4x4 -> 8x8
                gluon.nn.Dense(10),                             # dense0: K=384, M=10
                gluon.nn.Dense(16, flatten=False))              # dense1: K=10
    return net


def summary(rows):
    return [(r.layer, r.op, r.dimension, r.size, r.padded) for r in rows]


def test_known_misaligned_layers_are_listed_with_their_padding():
    rows = check_alignment(misaligned_net(), {'data': (8, 3, 4, 4)})
    assert summary(rows) == [
        ('net_conv0_fwd', 'Convolution', 'in_channels', 3, 8),
        ('net_conv0_fwd', 'Convolution', 'out_channels', 12, 16),
        ('net_conv1_fwd', 'Convolution', 'in_channels_per_group', 3, 8),
        ('net_conv1_fwd', 'Convolution', 'out_channels_per_group', 4, 8),
        ('net_conv2_fwd', 'Convolution', 'depthwise', 16, None),
        ('net_conv3_fwd', 'Deconvolution', 'out_channels', 6, 8),
        ('net_dense0_fwd', 'FullyConnected', 'out_features', 10, 16),
        ('net_dense1_fwd', 'FullyConnected', 'in_features', 10, 16),
    ]
    by_key = {(r.layer, r.dimension): r for r in rows}
    first = by_key[('net_conv0_fwd', 'in_channels')]
    assert first.fix == 'in_channels 3 -> pad to 8'
    assert (first.data_shape, first.weight_shape) == ((8, 3, 4, 4), (12, 3, 3, 3))
    assert first.output_shape == (8, 12, 4, 4)
    assert 'NVIDIA Deep Learning Performance guide' in first.rule and 'cuDNN 7.3' in first.rule
    assert by_key[('net_conv1_fwd', 'in_channels_per_group')].fix == \
        'in_channels_per_group 3 (12 / 4 groups) -> pad to 8 (in_channels 32)'
    assert 'per group' in by_key[('net_conv1_fwd', 'in_channels_per_group')].rule
    assert 'padding channels does not help' in by_key[('net_conv2_fwd', 'depthwise')].rule
    assert by_key[('net_dense0_fwd', 'out_features')].data_shape == (8, 6, 8, 8)
    assert 'GEMM M' in by_key[('net_dense0_fwd', 'out_features')].fix


def test_batch_size_enters_conv_m_and_fully_connected_n():
    # batch 3: conv M = 3*4*4 = 48 and deconvolution M = 3*8*8 = 192 are aligned; the
    # FullyConnected layers see N = 3.
    rows = check_alignment(misaligned_net(), {'data': (3, 3, 4, 4)})
    assert ('net_dense0_fwd', 'FullyConnected', 'batch', 3, 8) in summary(rows)
    assert ('net_dense1_fwd', 'FullyConnected', 'batch', 3, 8) in summary(rows)
    # 5x5 images: M = batch*5*5 = 75 is misaligned; batch 8 fixes it (8*25 = 200).
    data = mx.sym.var('data')
    conv = mx.sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=8, name='conv')
    (row,) = check_alignment(conv, {'data': (3, 8, 5, 5)})
    assert (row.dimension, row.size, row.padded) == ('M', 75, 80)
    assert row.fix.startswith('M = batch*out_H*out_W = 3*5*5 = 75 -> use a batch size that is '
                              'a multiple of 8 (e.g. 8 gives M = 200)')
    # 14x14 output: 196 = 4*49, so any even batch aligns M.
    (row,) = check_alignment(conv, {'data': (3, 8, 14, 14)})
    assert 'multiple of 2 (e.g. 4 gives M = 784)' in row.fix


def test_aligned_net_gives_no_rows():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, in_channels=8), gluon.nn.Dense(32))
    assert check_alignment(net, {'data': (8, 8, 6, 6)}) == []
    assert 'aligned' in format_alignment([])


def test_symbol_and_gluon_block_give_the_same_rows():
    net = misaligned_net()
    shapes = {'data': (8, 3, 4, 4)}
    sym = net(mx.sym.var('data'))
    assert check_alignment(sym, shapes) == check_alignment(net, shapes)


def test_nhwc_layout_reads_channels_from_the_last_axis():
    data = mx.sym.var('data')
    conv = mx.sym.Convolution(data, kernel=(3, 3), num_filter=20, layout='NHWC', name='c')
    rows = check_alignment(conv, {'data': (8, 9, 9, 3)})
    assert summary(rows) == [('c', 'Convolution', 'in_channels', 3, 8),
                             ('c', 'Convolution', 'out_channels', 20, 24)]


def test_multiple_is_configurable():
    data = mx.sym.var('data')
    fc = mx.sym.FullyConnected(data, num_hidden=12, name='fc')
    assert check_alignment(fc, {'data': (8, 16)}, multiple=4) == []
    assert summary(check_alignment(fc, {'data': (8, 16)})) == [
        ('fc', 'FullyConnected', 'out_features', 12, 16)]


def test_format_alignment_prints_one_line_per_row_with_the_fix():
    rows = check_alignment(misaligned_net(), {'data': (8, 3, 4, 4)})
    text = format_alignment(rows)
    lines = text.splitlines()
    assert lines[0].split()[:5] == ['layer', 'op', 'dimension', 'size', 'fix']
    assert len(lines) == len(rows) + 3
    assert 'in_channels 3 -> pad to 8' in lines[2]
    assert lines[-1].startswith('8 misaligned size(s) in 6 layer(s)')


def test_records_are_immutable():
    row = check_alignment(misaligned_net(), {'data': (8, 3, 4, 4)})[0]
    assert isinstance(row, Misalignment)
    with pytest.raises(Exception):
        row.size = 8


def test_bad_inputs_name_the_problem():
    net = misaligned_net()
    with pytest.raises(ValueError, match='input_shapes must be a non-empty dict'):
        check_alignment(net, (8, 3, 4, 4))
    with pytest.raises(ValueError, match='multiple must be a positive int'):
        check_alignment(net, {'data': (8, 3, 4, 4)}, multiple=0)
    sym = net(mx.sym.var('data'))
    with pytest.raises(ValueError, match='does not have'):
        check_alignment(sym, {'images': (8, 3, 4, 4)})
    with pytest.raises(TypeError, match='HybridBlock or an mxnet.symbol.Symbol'):
        check_alignment(object(), {'data': (8, 3, 4, 4)})


def test_converted_float16_graph_gives_the_same_rows_as_the_float32_one():
    net = misaligned_net()
    shapes = {'data': (8, 3, 4, 4)}
    sym = net(mx.sym.var('data'))
    converted = mxmp.convert_symbol(sym, 'float16')
    assert mxmp.count_casts(converted)['amp_cast'] > 0
    assert check_alignment(converted, shapes) == check_alignment(sym, shapes)
