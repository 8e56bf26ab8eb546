"""The operator library loads and runs in a process where libmxnet.so sits in the global symbol
scope, as after ``import horovod.mxnet`` (Horovod opens its MXNet library with RTLD_GLOBAL, which
brings libmxnet.so along; Sockeye imports Horovod whenever it is installed). libmxnet.so exports
lib_api's C++ symbols itself, built with another std::string ABI: a library whose calls could be
interposed registered its ops into libmxnet's registry and died of SIGFPE while loading
(``sockeye.train --amp`` through mxmp.amp, before ``-Wl,-Bsymbolic``)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = textwrap.dedent('''
    import ctypes, os, sys
    import mxnet as mx
    # what horovod.mxnet does to the process: libmxnet.so into the global scope
    ctypes.CDLL(os.path.join(os.path.dirname(mx.__file__), 'libmxnet.so'), ctypes.RTLD_GLOBAL)
    from mxmp._src.kernels.build import load_library
    assert load_library() is not None, 'the library did not load'
    x = mx.nd.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 1.0, 5.0]])
    y = mx.nd.mxmp_layer_norm(x, mx.nd.ones((4,)), mx.nd.zeros((4,)))
    y = y[0] if isinstance(y, (list, tuple)) else y
    print(' '.join('%.6f' % v for v in y.asnumpy().ravel()))
''')


def test_library_loads_and_runs_with_libmxnet_in_the_global_scope():
    pytest.importorskip('mxnet')
    import shutil
    if not any(shutil.which(c) for c in (os.environ.get('CXX') or 'g++', 'g++', 'c++')):
        pytest.skip("no C++ compiler: the library cannot build here (MXNet's kernels run)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run([sys.executable, '-c', CODE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    got = np.array([float(v) for v in proc.stdout.split()[-8:]]).reshape(2, 4)
    x = np.array([[1.0, 2.0, 3.0, 4.0], [-1.0, 0.0, 1.0, 5.0]])
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
