"""The one command behind every benchmark tool: ``python -m benchmarks [TOOL [ARGS...]]``.

    python -m benchmarks                         # the tools, a line each
    python -m benchmarks kernel_ops --threads 1 2
    python -m benchmarks TOOL --help             # the tool's own flags

``TOOL`` is a module of this package with a ``main`` (:data:`TOOLS`); the command runs that
module's ``main`` with ``ARGS``, exactly as ``python -m benchmarks.TOOL ARGS`` does (the form
docs/benchmark.md cites; both run the same code). The speed and memory benchmark of the README
is ``scripts/benchmark.py``, whose modes, statistics and tables are this package
(``benchmarks/__init__.py``); it is listed here too, as ``benchmark``.

Exit status: the tool's; 2 for an unknown tool, with the list.
"""
import importlib
import inspect
import os
import sys

#: The tools, each a module of this package with ``main`` (``benchmark`` is
#: ``scripts/benchmark.py``). The other modules are the tools' parts (modes, statistics,
#: reports) or the per-process workers the tools start themselves.
TOOLS = ('benchmark', 'accuracy', 'accuracy_transformer', 'transformer_report', 'gpt',
         'gpt_vocab', 'fused_accuracy', 'fold_rounding', 'hard_swish', 'kernel_ops',
         'kernels_ab', 'gelu_ab', 'attention_routes', 'host_cost', 'optimizer_update',
         'freeze_speed', 'nmt_loop', 'rss_stages', 'train_rss', 'backward_kept',
         'mirror_probe', 'conv_ceiling', 'dnnl_verbose', 'scaling')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module(tool):
    """The module whose ``main`` runs ``tool``."""
    if tool == 'benchmark':
        sys.path.insert(0, os.path.join(ROOT, 'scripts'))
        return importlib.import_module('benchmark')
    return importlib.import_module('benchmarks.' + tool)


def summary(tool):
    """The first sentence of ``tool``'s module docstring (str), read without importing it."""
    path = (os.path.join(ROOT, 'scripts', 'benchmark.py') if tool == 'benchmark' else
            os.path.join(ROOT, 'benchmarks', tool + '.py'))
    with open(path) as f:
        text = f.read()
    start = text.find('"""')
    if start < 0:
        return ''
    first = ' '.join(text[start + 3:].split('\n\n', 1)[0].split())
    first = first.split('. ', 1)[0]
    return first if first.endswith(('.', '?')) else first + '.'


def main(argv=None):
    """Run one tool (``argv``: [TOOL, ARGS...], default ``sys.argv[1:]``) or list them.

    Returns:
        int: the tool's exit status (its ``main``'s return value, 0 for None); 0 after the
        list; 2 for an unknown tool.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ('-h', '--help'):
        print(__doc__.split('\n\n')[0] + '\n')
        width = max(len(t) for t in TOOLS)
        for tool in TOOLS:
            print('  %-*s  %s' % (width, tool, summary(tool)))
        return 0
    tool, args = argv[0], argv[1:]
    if tool not in TOOLS:
        print('python -m benchmarks: unknown tool %r; the tools: %s'
              % (tool, ', '.join(TOOLS)), file=sys.stderr)
        return 2
    run = _module(tool).main
    sys.argv = ['python -m benchmarks ' + tool] + args
    status = run(args) if inspect.signature(run).parameters else run()
    return status if isinstance(status, int) else 0


if __name__ == '__main__':
    sys.exit(main())
