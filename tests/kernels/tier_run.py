"""What this directory's tests share: :func:`run_on_tier` runs one of its worker scripts in a
fresh process on a CPU tier and returns the JSON record it prints last (the library's
AVX512-BF16 and portable paths are chosen when the library loads, so each tier needs its own
process), :data:`needs_library` skips a test where mxmp's operator library does not build, and
:func:`exported` writes a converted network's files as ``export`` does."""
import json
import os
import subprocess
import sys

import pytest

from mxmp._src.kernels.build import load_library

HERE = os.path.dirname(os.path.abspath(__file__))
#: Skips a test of mxmp's operator library where the library does not build.
needs_library = pytest.mark.skipif(load_library() is None, reason="mxmp's operator library "
                                   'does not build here (no C++ compiler?)')


def run_on_tier(script, isa):
    """The last stdout line of ``script`` (a file in tests/kernels/) parsed as JSON, run with
    OMP_NUM_THREADS=2 and ``DNNL_MAX_CPU_ISA=isa`` (None: the CPU's own tier)."""
    env = dict(os.environ, OMP_NUM_THREADS='2')
    env.pop('DNNL_MAX_CPU_ISA', None)
    if isa:
        env['DNNL_MAX_CPU_ISA'] = isa
    proc = subprocess.run([sys.executable, os.path.join(HERE, script)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_on_tiers(script):
    """``{'native': record, 'AVX2': record}``: ``script`` run on the CPU's own tier and under
    ``DNNL_MAX_CPU_ISA=AVX2`` (:func:`run_on_tier`)."""
    return {'native': run_on_tier(script, None), 'AVX2': run_on_tier(script, 'AVX2')}


def exported(make_net, path):
    """A network from ``make_net()`` (a HybridBlock taking (5, 2, 16) float32 data), initialized
    from seed 0, converted to bfloat16 and called once: ``(the converted graph's JSON nodes,
    [the float32 graph JSON, the converted graph JSON] that its ``export`` wrote)`` under
    ``path`` (str, a file prefix)."""
    import mxnet as mx
    import mxmp
    mx.random.seed(0)
    net = make_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net = mxmp.convert(net, 'bfloat16')
    net(mx.nd.ones((5, 2, 16)))
    nodes = json.loads(mxmp.converted_graph(net).tojson(remove_amp_cast=False))['nodes']
    files = []
    for keep_casts in (False, True):   # the float32 graph, and the converted one
        name = '%s_%d' % (path, keep_casts)
        net.export(name, remove_amp_cast=not keep_casts)
        with open(name + '-symbol.json') as f:
            files.append(json.load(f))
    return nodes, files
