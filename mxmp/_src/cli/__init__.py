"""The ``mxmp`` command line (the public face is :mod:`mxmp.cli`)."""
