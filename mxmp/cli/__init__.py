"""The ``mxmp`` command line: convert, explain, check-alignment, diagnose, plot, check-kernels.

Subcommands (``mxmp SUBCOMMAND --help`` for each)::

    mxmp convert model-symbol.json model-0000.params --dtype bfloat16 --out model-bf16
    mxmp convert model-bf16-symbol.json model-bf16-0000.params --strip --out model-fp32
    mxmp explain model-symbol.json --dtype float16 [--json]
    mxmp check-alignment model-symbol.json --shape data=32,3,224,224
    mxmp diagnose model-symbol.json model-0000.params --rec val.rec [--dtype float16] [--out dir]
    mxmp diagnose model-symbol.json model-0000.params --synthetic --data-shape 3,32,32
    mxmp plot runs/bf16/metrics.jsonl --out curves.png

Models are the two files that ``HybridBlock.export(prefix)`` and ``Module.save_checkpoint``
write: ``prefix-symbol.json`` and ``prefix-NNNN.params`` (keys ``arg:name``/``aux:name``;
files from ``save_parameters`` without the prefixes are accepted too).

Bad input (a missing file, a file that is not a symbol or params file, a symbol and params that
do not belong together, an unknown dtype) ends with one line ``mxmp SUBCOMMAND: error: ...`` on
stderr and exit code 1 (2 for command-line syntax errors, from argparse), never a traceback.
Set ``MXMP_DEBUG=1`` to get the traceback of an unexpected error.

The console entry point is ``mxmp = mxmp.cli:main``; ``python -m mxmp.cli`` works too.
Where things are: :mod:`mxmp.cli.main` (argparse and the entry point),
:mod:`mxmp.cli.commands` (one function per subcommand), :mod:`mxmp.cli.model_io` (loading,
checking, converting and writing the model files; the diagnose batch).
"""
import os

# MXNet logs "Subgraph backend MKLDNN is activated." on every bind; keep the output clean.
os.environ.setdefault('MXNET_SUBGRAPH_VERBOSE', '0')

# pylint: disable=wrong-import-position
from ..errors import CLIError, mxnet_error_line  # noqa: E402,F401
from .commands import (cmd_check_alignment, cmd_convert, cmd_diagnose,  # noqa: E402,F401
                       cmd_explain, cmd_plot)
from .main import build_parser, main  # noqa: E402
from .model_io import load_params, load_symbol  # noqa: E402,F401

__all__ = ['main', 'build_parser', 'CLIError']
