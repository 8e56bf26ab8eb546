"""Worker of tests/device/test_cpu_tier.py: in a process whose oneDNN cap (DNNL_MAX_CPU_ISA) the
test chose, print one JSON line: mxmp's tier, the bfloat16 probe, and the SlowerThanFloat32Warnings
of an emulated conversion, then of three real ones (two convert_symbol, one mxmp.convert)."""
import json
import os
import sys
import warnings

import mxnet as mx
from mxnet import gluon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
import mxmp  # noqa: E402
from mxmp._src.cpu_tier import cpu_tier  # noqa: E402


def _net():
    data = mx.sym.var('data')
    fc = mx.sym.FullyConnected(data, num_hidden=8, name='fc')
    return mx.sym.FullyConnected(mx.sym.relu(fc), num_hidden=4, name='out')


def main():
    out = {'tier': cpu_tier(), 'kernels': mxmp.lp_kernels_available('bfloat16')}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        mxmp.convert_symbol(_net(), 'bfloat16', emulate=True)
        out['after_emulated'] = len(caught)
        if out['kernels']:
            mxmp.convert_symbol(_net(), 'bfloat16', emulate=False)
            mxmp.convert_symbol(_net(), 'bfloat16', emulate=False)
            net = gluon.nn.HybridSequential()
            net.add(gluon.nn.Dense(8, in_units=4))
            net.initialize()
            mxmp.convert(net, 'bfloat16')
            net(mx.nd.ones((2, 4))).wait_to_read()
    out['warnings'] = [str(w.message) for w in caught
                       if issubclass(w.category, mxmp.SlowerThanFloat32Warning)]
    print(json.dumps(out))


if __name__ == '__main__':
    main()
