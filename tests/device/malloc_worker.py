"""Worker of tests/device/test_malloc_tuning.py: in a fresh process (the tuning is once per process
and process-wide), run one scenario of conversions, then print one JSON line: whether this process
has oneDNN's bfloat16 kernels, how many MiB of a 24 MiB malloc glibc served by mmap
(``mallinfo2().hblkhd`` before and after the malloc: 24 with glibc's defaults, 0 after the
tuning), the ``mxmp.malloc`` log records, and the error a conversion raised."""
import ctypes
import json
import logging
import os
import sys

import mxnet as mx
from mxnet import gluon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import mxmp  # noqa: E402


class _MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (<malloc.h>, glibc 2.33 and later): every field a size_t."""
    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks',
        'fordblks', 'keepcost')]


def mmapped_mib(size_mib=24):
    """int: MiB by which glibc's mmapped total grows while a ``size_mib`` malloc is held.
    Probed once per process: freeing an mmapped chunk raises glibc's dynamic threshold."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblkhd
    block = libc.malloc(size_mib << 20)
    grown = libc.mallinfo2().hblkhd - before
    libc.free(block)
    return int(round(grown / 2 ** 20))


def _sym():
    fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8, name='fc')
    return mx.sym.FullyConnected(mx.sym.relu(fc), num_hidden=4, name='out')


def _gluon(target_dtype, **kwargs):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=4), gluon.nn.Dense(4, in_units=8))
    net.initialize()
    mxmp.convert(net, target_dtype, **kwargs)
    net(mx.nd.ones((2, 4))).wait_to_read()


def _module():
    sym = mx.sym.SoftmaxOutput(_sym(), name='softmax')
    mod = mxmp.Module(sym, target_dtype='bfloat16')
    mod.bind(data_shapes=[('data', (2, 4))], label_shapes=[('softmax_label', (2,))])


def _float32_kernels():
    """float32 with mxmp's library kernels (the benchmark's float32 baseline)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    from benchmarks.float32_kernels import float32_library_kernels
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=4), gluon.nn.LayerNorm(in_channels=8))
    net.initialize()
    float32_library_kernels(net, ['data'])(mx.nd.ones((2, 4))).wait_to_read()


def _amp():
    from mxmp import amp
    amp.convert_symbol(_sym(), 'bfloat16')


SCENARIOS = {
    'none': [],
    'gluon': [lambda: _gluon('bfloat16')],
    'module': [_module],
    'amp': [_amp],
    'three': [lambda: _gluon('bfloat16'), _module, _amp],
    'float32_kernels': [_float32_kernels],
    'float16': [lambda: _gluon('float16')],
    'emulated': [lambda: _gluon('bfloat16', emulate=True)],
}


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append([record.levelname, record.getMessage()])


def main(scenario):
    records = _Records()
    log = logging.getLogger('mxmp.malloc')
    log.setLevel(logging.DEBUG)
    log.addHandler(records)
    error = None
    try:
        for step in SCENARIOS[scenario]:
            step()
    except ValueError as err:
        error = str(err)
    print(json.dumps({'kernels': mxmp.lp_kernels_available('bfloat16'), 'error': error,
                      'mmapped_mib': mmapped_mib(), 'records': records.records}))


if __name__ == '__main__':
    main(sys.argv[1])
