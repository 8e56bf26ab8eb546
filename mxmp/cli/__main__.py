"""``python -m mxmp.cli``: the ``mxmp`` command."""
import sys

from .._src.cli.main import main

sys.exit(main())
