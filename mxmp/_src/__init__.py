"""mxmp's internals: importable, not API (the API is ``mxmp/__init__.py``, ``mxmp.amp``,
``mxmp.horovod`` and the ``mxmp`` command, :mod:`mxmp.cli`)."""
