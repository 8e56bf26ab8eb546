"""contrib.amp's API on mxmp (the public face is :mod:`mxmp.amp`)."""
