"""``python -m mxmp.cli``: the ``mxmp`` command."""
import sys

from . import main

sys.exit(main())
