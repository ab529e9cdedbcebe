"""The store as a vLLM KV connector (``clients.vllm_connector.connector.KVStoreConnector``).

Importing this package imports nothing of vLLM: only ``connector`` and ``stats`` do, and
they are loaded by vLLM itself, in its own venv (clients/vllm_connector/README.md).
"""
