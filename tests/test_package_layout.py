"""The package stays laid out by job: small modules, small classes, no import cycles, and every
name of the README's API table importable from where the README says.

These read the source (ast), so they run in milliseconds and fail with the file and line to fix.
"""
import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'mxmp'
#: Operator tables: data, one op per line with its reason, long by nature.
OP_TABLES = ('mxmp/_src/policy/ops_shared.py', 'mxmp/_src/policy/ops_float16.py',
             'mxmp/_src/policy/ops_bfloat16.py')
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


def test_no_module_is_longer_than_400_lines_except_the_op_tables():
    long = {_rel(p): n for p in _modules() if _rel(p) not in OP_TABLES
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
