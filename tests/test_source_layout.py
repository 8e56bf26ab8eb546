"""The package stays laid out by job: small modules, small classes, no import cycles, and every
name of the README's API table importable from where the README says.

These read the source (ast), so they run in milliseconds and fail with the file and line to fix.
"""
import ast
import importlib
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'mxmp'
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300


def _modules():
    return sorted(PACKAGE.rglob('*.py'))


def _rel(path):
    return path.relative_to(ROOT).as_posix()


def _dotted(path):
    parts = list(path.relative_to(ROOT).with_suffix('').parts)
    if parts[-1] == '__init__':
        parts.pop()
    return '.'.join(parts)


def test_no_module_is_longer_than_400_lines():
    long = {_rel(p): n for p in _modules()
            for n in [len(p.read_text().splitlines())] if n > MAX_MODULE_LINES}
    assert not long, 'split these modules by job (lines): %s' % long


def test_no_class_is_longer_than_300_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    long['%s:%d %s' % (_rel(path), node.lineno, node.name)] = n
    assert not long, 'move jobs out of these classes (lines): %s' % long


def _import_edges():
    """module -> set of mxmp modules it imports (at any level: top or inside functions)."""
    names = {_dotted(p): p for p in _modules()}
    edges = {}
    for name, path in names.items():
        package = name if path.name == '__init__.py' else name.rsplit('.', 1)[0]
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split('.')
                    base = base[:len(base) - (node.level - 1)]
                    target = '.'.join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ''
                for alias in node.names:
                    sub = '%s.%s' % (target, alias.name)
                    out.add(sub if sub in names else target)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
        edges[name] = {t for t in out if t in names and t != name}
    return edges


def test_no_import_cycles_inside_mxmp():
    edges = _import_edges()
    # A package's __init__ that re-exports its submodules is imported before them by Python
    # itself; an edge back to it from a submodule is a cycle only when written explicitly,
    # which is what is checked here.
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = 'open'
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 'open':
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 'done'

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not cycles, 'import cycles: %s' % [' -> '.join(c) for c in cycles]


def _readme_api_names():
    text = (ROOT / 'README.md').read_text()
    table = text[text.index('## API'):]
    table = table[:table.index('\n## ', 1)]
    return sorted(set(re.findall(r'`(mxmp(?:\.[A-Za-z_]\w*)+)', table)))


def test_every_name_in_the_readme_api_table_imports_from_where_the_readme_says():
    names = _readme_api_names()
    assert len(names) >= 15, names   # the table was found and read
    missing = []
    for dotted in names:
        module, _, attr = dotted.rpartition('.')
        try:
            obj = importlib.import_module(module)
        except ImportError:
            missing.append(dotted)
            continue
        if not hasattr(obj, attr):
            missing.append(dotted)
    assert not missing, missing



def test_the_readme_api_table_is_mxmp_all():
    import mxmp
    table = {name.split('.')[1] for name in _readme_api_names()
             if name.count('.') == 1 or name.split('.')[1] == 'amp'}
    assert table == set(mxmp.__all__), (sorted(table ^ set(mxmp.__all__)))
    for name in mxmp.__all__:
        assert getattr(mxmp, name) is not None, name


#: The public modules: the API and the faces of contrib.amp, Horovod and the command line.
PUBLIC = {'mxmp', 'mxmp.amp', 'mxmp.amp.lists', 'mxmp.amp.lists.symbol_fp16',
          'mxmp.amp.lists.symbol_bf16', 'mxmp.horovod', 'mxmp.cli'}


def test_every_module_is_public_or_under_src():
    names = {_dotted(p) for p in _modules()}
    assert {n for n in names if not n.startswith('mxmp._src')} == PUBLIC


def _only_reexports(path):
    """True when a module defines nothing: only imports (and ``__all__``/a docstring)."""
    body = ast.parse(path.read_text()).body
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    defines = [n for n in body if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Expr))
               and not (isinstance(n, ast.Assign) and [getattr(t, 'id', '') for t in n.targets]
                        == ['__all__'])]
    return bool(imports) and not defines


def test_no_internal_module_only_reexports_another_modules_names():
    offenders = [_rel(p) for p in _modules()
                 if _dotted(p).startswith('mxmp._src') and _only_reexports(p)]
    assert not offenders, offenders


def test_nothing_is_stamped_on_mxnet_objects_outside_the_hook_module():
    """Side channels (attributes stamped on Parameters or blocks, patched methods, registries
    keyed by id()) live only in mxmp/_src/gluon.py, the one module that hooks MXNet. That
    includes contrib.amp's own hook on a gluon.Trainer (``_amp_loss_scaler`` and
    ``_amp_original_scale``, which MXNet's Trainer and contrib.amp's users read): gluon.py's
    attach_trainer_loss_scaler is the only place that sets them. A hit that is not one (an id()
    key of a dict local to one call) says why in a comment on its line."""
    pattern = re.compile(r'\.\_(mxmp|amp)_\w+\s*=|setattr\([^)]*[\'"]_(mxmp|amp)_|MethodType|'
                         r'\bid\(')
    hits = ['%s:%d: %s' % (_rel(p), i, line.strip())
            for p in _modules() if _rel(p) != 'mxmp/_src/gluon.py'
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line) and '#' not in line]
    assert not hits, hits


def test_import_mxmp_loads_the_core_only():
    code = ('import sys, mxmp; mods = sorted(m for m in sys.modules if m.startswith("mxmp")); '
            'print(len(mods)); print(" ".join(mods))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, cwd=str(ROOT)).stdout.split('\n')
    mods = out[1].split()
    assert int(out[0]) <= 30, mods
    tools = [m for m in mods if m.split('.')[2:3] and m.split('.')[2] in
             ('diagnose', 'plotting', 'conformance', 'cli', 'alignment', 'amp')]
    assert not tools, tools


def test_every_exception_is_defined_in_errors():
    import mxmp._src.errors
    defined = []
    for path in _modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id.endswith(('Error', 'Warning', 'Exception'))
                    for b in node.bases):
                defined.append('%s.%s' % (_dotted(path), node.name))
    # CudaLibrariesNotFound stays beside the library table its message is made of
    # (mxmp._src.cuda runs before MXNet loads); mxmp._src.errors re-exports it.
    assert sorted(defined) == ['mxmp._src.cuda.CudaLibrariesNotFound'] + sorted(
        'mxmp._src.errors.%s' % n for n in mxmp._src.errors.__all__
        if n not in ('mxnet_error_line', 'CudaLibrariesNotFound')), defined
