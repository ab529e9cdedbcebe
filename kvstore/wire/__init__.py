"""The wire layer: what the cache daemon, the storage nodes and every client agree on.

The protocol (``proto/kvstore.proto``, stubs built by ``make proto``), the block codec
(chunks of encoded blocks, namespaces and durabilities as messages), the mapping of store
errors to gRPC status codes and back, bearer-token metadata, channel settings, the
first-contact rule every client follows (``contact``), and the stats messages. Part of the core: it imports nothing from ``clients``, ``storage_nodes``,
``engine``, ``kernels`` or ``bounded_replay`` (``tests/test_layers.py``).
"""
