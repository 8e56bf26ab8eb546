"""The ``tag`` fixture (tests/helpers.py) for the multi-process jobs of this directory."""
from helpers import tag  # noqa: F401  (a fixture: pytest finds it here)
