"""``python -m benchmarks``: one command lists and runs every benchmark tool."""
import ast
import glob
import os
import subprocess
import sys

from benchmarks.__main__ import ROOT, TOOLS, summary

#: Modules with a ``__main__`` block that are not tools: the per-process workers the tools
#: start themselves.
WORKERS = {'worker'}


def _has_main_block(path):
    tree = ast.parse(open(path).read())
    return any(isinstance(n, ast.If) and "__name__" in ast.unparse(n.test) for n in tree.body)


def test_every_runnable_module_is_a_listed_tool_with_a_main_and_a_summary():
    paths = glob.glob(os.path.join(ROOT, 'benchmarks', '*.py'))
    runnable = {os.path.basename(p)[:-3] for p in paths
                if not p.endswith('__main__.py') and _has_main_block(p)}
    assert runnable - WORKERS == set(TOOLS) - {'benchmark'}
    for tool in TOOLS:
        path = (os.path.join(ROOT, 'scripts', 'benchmark.py') if tool == 'benchmark' else
                os.path.join(ROOT, 'benchmarks', tool + '.py'))
        tree = ast.parse(open(path).read())
        assert any(isinstance(n, ast.FunctionDef) and n.name == 'main' for n in tree.body), tool
        assert summary(tool), tool


def _run(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, '-m', 'benchmarks'] + list(args), capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def test_without_a_tool_it_lists_every_tool_with_its_summary():
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith('  ')]
    assert listed == list(TOOLS)
    assert summary('kernel_ops') in proc.stdout


def test_an_unknown_tool_exits_2_naming_the_tools():
    proc = _run('no_such_tool')
    assert proc.returncode == 2
    assert 'unknown tool' in proc.stderr and 'kernel_ops' in proc.stderr


def test_a_tool_runs_with_its_own_flags():
    proc = _run('kernel_ops', '--help')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('usage: python -m benchmarks kernel_ops')
    assert '--repeats' in proc.stdout
    proc = _run('kernel_ops', '--ops', 'nope')   # the tool's own error, its own status
    assert proc.returncode == 2 and 'unknown op(s) nope' in proc.stderr
