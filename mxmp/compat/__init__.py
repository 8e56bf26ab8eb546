"""Drop-in compatibility with other mixed-precision APIs (``mxnet.contrib.amp``); the
user-facing module is :mod:`mxmp.amp`.
"""
