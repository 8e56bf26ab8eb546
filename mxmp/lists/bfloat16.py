"""Old path of the bfloat16 op table: mxmp/policy/ops_shared.py + ops_bfloat16.py, merged."""
from ..policy.tables import table

globals().update(table('bfloat16'))
del table
