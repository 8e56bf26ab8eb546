"""mxmp's internals: importable, not API (the API is ``mxmp/__init__.py``, ``mxmp.amp``,
``mxmp._src.horovod`` and the ``mxmp`` command)."""
