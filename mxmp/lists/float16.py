"""Old path of the float16 op table: mxmp/policy/ops_shared.py + ops_float16.py, merged."""
from ..policy.tables import table

globals().update(table('float16'))
del table
