"""The cache daemon (``kvstore serve``): the ``KVStore`` gRPC service over the embedded
tier manager, with auth, metrics, an access log and a same-host shared-memory path."""
