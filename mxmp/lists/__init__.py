"""Old path of the op tables: they moved to :mod:`mxmp.policy` (tables, coverage, ops_*.py).

``mxmp.lists.float16`` and ``mxmp.lists.bfloat16`` keep the names of each dtype's merged table.
"""
from ..policy.coverage import EXCLUDED_PREFIXES, NOT_EXCLUDED, excluded_reason  # noqa: F401
from ..policy.tables import OP_CLASSES, classes_for  # noqa: F401
from . import bfloat16, float16  # noqa: F401
