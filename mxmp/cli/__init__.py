"""The ``mxmp`` command: convert, explain, check-alignment, diagnose, plot, check-kernels.

``mxmp SUBCOMMAND --help`` (or ``python -m mxmp.cli``) documents each subcommand; docs/cli.md
gives examples. Bad input ends with one line ``mxmp SUBCOMMAND: error: ...`` on stderr and exit
code 1 (2 for command-line syntax errors, from argparse); ``MXMP_DEBUG=1`` shows the traceback
of an unexpected error.
"""
from .._src.cli.main import build_parser, main
from .._src.errors import CLIError

__all__ = ['main', 'build_parser', 'CLIError']
