"""Parameter files against plain Gluon 1.9.1, both directions: every kind of file (dotted
names of save_parameters, prefix-stripped names of collect_params().save(f, strip_prefix=...),
a SymbolBlock's, a converted block's) that plain Gluon loads into a network loads into the
converted twin with the same values; every file a converted block writes (HybridBlock or plain
gluon.Block, with and without cast_params) is float32 and plain Gluon loads it."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, nd

import mxmp
from mxmp._src.dtypes import dtype_name, mx_dtype


class Outer(gluon.Block):
    """A plain Block (Python forward) around two HybridBlocks."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.first = gluon.nn.Dense(16, in_units=8)
            self.second = gluon.nn.Dense(3, in_units=16)

    def forward(self, x):   # pylint: disable=arguments-differ
        return self.second(mx.nd.relu(self.first(x)))


def build(kind, seed, init=True):
    mx.random.seed(seed)
    if kind == 'block':
        net = Outer()
    else:
        net = gluon.nn.HybridSequential()
        with net.name_scope():
            net.add(gluon.nn.Dense(16, in_units=8, activation='relu'),
                    gluon.nn.Dense(3, in_units=16))
    if init:
        net.initialize(mx.init.Xavier())
    return net


def x_batch():
    return nd.array(np.random.RandomState(0).normal(size=(4, 8)))


def by_name(net):
    """structural name -> float32 numpy value (what plain save_parameters keys)."""
    return {k: nd.amp_cast(p.data(), dtype='float32').asnumpy()
            for k, p in net._collect_params_with_prefix().items()}


def write(net, how, path):
    if how == 'dotted':
        net.save_parameters(path)
    else:
        net.collect_params().save(path, strip_prefix=net.prefix)
    return path


def try_load(net, path):
    try:
        net.load_parameters(path)
        return None
    except (AssertionError, ValueError, RuntimeError) as err:
        return err


def rounded(values, dtype):
    return {k: nd.amp_cast(nd.amp_cast(nd.array(v), dtype=mx_dtype(dtype)),
                           dtype='float32').asnumpy()
            for k, v in values.items()}


@pytest.mark.parametrize('kind', ['hybrid', 'block'])
@pytest.mark.parametrize('cast_params', [False, True])
@pytest.mark.parametrize('how', ['dotted', 'stripped'])
def test_plain_gluon_files_load_into_the_converted_twin(tmp_path, kind, cast_params, how):
    source = build(kind, 0)
    path = write(source, how, str(tmp_path / 'plain.params'))
    plain, conv = build(kind, 5), build(kind, 6)
    mxmp.convert(conv, 'bfloat16', cast_params=cast_params)
    assert try_load(plain, path) is None            # plain Gluon loads it ...
    err = try_load(conv, path)                       # ... and so does the converted twin
    assert err is None, err                          # before (stripped): ParameterFileError
    want = by_name(plain)
    if cast_params:   # stored in bfloat16: the file's values rounded once
        want = rounded(want, 'bfloat16')
    got = by_name(conv)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    out = conv(x_batch())
    assert out.dtype == np.float32


@pytest.mark.parametrize('kind', ['hybrid', 'block'])
@pytest.mark.parametrize('cast_params', [False, True])
@pytest.mark.parametrize('how', ['dotted', 'stripped'])
def test_files_of_a_converted_block_are_float32_and_load_into_plain_gluon(tmp_path, kind,
                                                                          cast_params, how):
    conv = build(kind, 0)
    before = by_name(conv)
    mxmp.convert(conv, 'bfloat16', cast_params=cast_params)
    ref = conv(x_batch()).asnumpy()
    path = write(conv, how, str(tmp_path / 'conv.params'))
    saved = nd.load(path)
    # before (block + cast_params): bfloat16 arrays beside float32 ones
    assert {dtype_name(v.dtype) for v in saved.values()} == {'float32'}
    plain = build(kind, 5)
    assert try_load(plain, path) is None
    got = by_name(plain)
    want = rounded(before, 'bfloat16') if cast_params else before
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    twin = build(kind, 6)                            # and back into a converted twin
    mxmp.convert(twin, 'bfloat16', cast_params=cast_params)
    assert try_load(twin, path) is None
    np.testing.assert_array_equal(twin(x_batch()).asnumpy(), ref)


@pytest.mark.parametrize('cast_params', [False, True])
def test_symbolblock_files_load_wherever_plain_gluon_loads_them(tmp_path, cast_params):
    """Files from a SymbolBlock (its save_parameters, its collect_params().save with full
    names, export's arg:/aux: file) into SymbolBlocks and HybridSequentials: wherever plain
    Gluon loads one, the converted twin loads it with the same values; the converted
    SymbolBlock's own file is float32 and loads back into plain Gluon."""
    net = build('hybrid', 0)
    net.hybridize()
    net(x_batch())
    net.export(str(tmp_path / 'model'))
    sym, params = str(tmp_path / 'model-symbol.json'), str(tmp_path / 'model-0000.params')

    def imported():
        block = gluon.SymbolBlock.imports(sym, ['data'], params)
        for p in block.collect_params().values():
            p.set_data(p.data().zeros_like())
        return block
    source = gluon.SymbolBlock.imports(sym, ['data'], params)
    values = [by_name(source)[k] for k in sorted(by_name(source))]
    files = {'save_parameters': str(tmp_path / 'sb.params'),
             'full names': str(tmp_path / 'full.params'), 'export': params}
    source.save_parameters(files['save_parameters'])
    source.collect_params().save(files['full names'])
    loaded = []
    for name, path in files.items():
        for target in (imported, lambda: build('hybrid', 0)):
            plain, conv = target(), target()
            mxmp.convert(conv, 'bfloat16', cast_params=cast_params)
            if try_load(plain, path) is not None:
                continue
            loaded.append(name)
            err = try_load(conv, path)
            assert err is None, (name, err)
            want = [by_name(plain)[k] for k in sorted(by_name(plain))]
            if cast_params:
                want = [v for _, v in sorted(rounded(dict(enumerate(want)), 'bfloat16').items())]
            got = [by_name(conv)[k] for k in sorted(by_name(conv))]
            for w, g, v in zip(want, got, values):
                np.testing.assert_array_equal(g, w)
                np.testing.assert_allclose(w, v, rtol=2 ** -7)
            # its own file is the plain block's file: same keys, float32, loads where that does
            back, own = str(tmp_path / 'back.params'), str(tmp_path / 'own.params')
            conv.save_parameters(back)
            plain.save_parameters(own)
            assert sorted(nd.load(back)) == sorted(nd.load(own))
            assert {dtype_name(v.dtype) for v in nd.load(back).values()} == {'float32'}
            assert (try_load(target(), back) is None) == (try_load(target(), own) is None)
    assert 'full names' in loaded and 'export' in loaded, loaded


@pytest.mark.parametrize('kind', ['hybrid', 'block'])
def test_files_plain_gluon_refuses_are_refused_by_the_converted_twin_too(tmp_path, kind):
    """A stripped file saved from another architecture: both refuse, naming the key."""
    path = str(tmp_path / 'other.params')
    nd.save(path, {'nosuch_weight': nd.ones((2, 2))})
    plain, conv = build(kind, 5), build(kind, 6)
    mxmp.convert(conv, 'bfloat16', cast_params=True)
    assert try_load(plain, path) is not None
    err = try_load(conv, path)
    assert err is not None and 'nosuch_weight' in str(err)


def _param_dict_load(net, path):
    try:
        net.collect_params().load(path, restore_prefix=net.prefix)
        return None
    except (AssertionError, ValueError, RuntimeError) as err:
        return err


@pytest.mark.parametrize('cast_params', [False, True])
def test_param_dict_load_takes_a_float32_file_and_keeps_it_whole_in_the_masters(tmp_path,
                                                                                cast_params):
    """``collect_params().load`` (names less the prefix) of a plain file into the converted twin: loaded
    where plain Gluon loads it (before: a bfloat16 Parameter refused the float32 file), the
    stored values the file's rounded once, and the Trainer's master weights the file's float32
    values, so saving again writes the file back bit for bit."""
    source = build('hybrid', 0)
    path = str(tmp_path / 'full.params')
    source.collect_params().save(path, strip_prefix=source.prefix)
    plain = build('hybrid', 5)
    assert _param_dict_load(plain, path) is None
    conv = build('hybrid', 6)
    mxmp.convert(conv, 'bfloat16', cast_params=cast_params)
    trainer = mxmp.Trainer(conv.collect_params(), 'sgd', {'learning_rate': 0.0})
    with mx.autograd.record():
        loss = conv(x_batch()).sum()
    loss.backward()
    trainer.step(1)   # the masters exist before the load
    err = _param_dict_load(conv, path)
    assert err is None, err
    want = by_name(source)
    got = by_name(conv)
    for k in want:
        np.testing.assert_array_equal(got[k], rounded({k: want[k]}, 'bfloat16')[k]
                                      if cast_params and k.endswith('weight') else want[k])
    with mx.autograd.record():
        loss = conv(x_batch()).sum()
    loss.backward()
    trainer.step(1)   # lr 0: the masters, not the old values, are written back
    again = str(tmp_path / 'again.params')
    conv.collect_params().save(again, strip_prefix=conv.prefix)
    back, orig = nd.load(again), nd.load(path)
    assert sorted(back) == sorted(orig)
    for k in orig:
        np.testing.assert_array_equal(back[k].asnumpy(), orig[k].asnumpy())
    nd.save(str(tmp_path / 'other.params'), {'nosuch_weight': nd.ones((2, 2))})
    err = _param_dict_load(conv, str(tmp_path / 'other.params'))   # as plain Gluon: refused
    assert _param_dict_load(plain, str(tmp_path / 'other.params')) is not None
    assert err is not None and 'nosuch_weight' in str(err)
