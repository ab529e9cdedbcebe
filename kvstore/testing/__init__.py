"""Test scaffolding for the store: a cache-daemon spawner (``kvstore serve`` in a child
process on a free port, stopped and reaped, with kill -9 for crash tests).

The product never imports this package (``tests/test_layers.py``) and the wheel leaves it
out (``pyproject.toml``); tests and benchmarks import it from the source tree.
"""
