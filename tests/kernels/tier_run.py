"""Runs one of this directory's worker scripts in a fresh process on a CPU tier and returns the
JSON record it prints last (the library's AVX512-BF16 and portable paths are chosen when the
library loads, so each tier needs its own process)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


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
