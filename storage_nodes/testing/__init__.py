"""Test scaffolding for the storage nodes: power-cut and fault-injecting SSD backends, the
crash seams (``crash``: crash-point hooks, stopping a tier as a crash would), and process
spawners for nodes and local clusters.

The product never imports this package (``tests/test_layers.py``) and the wheel leaves it
out (``pyproject.toml``); tests and benchmarks import it from the source tree.
"""
