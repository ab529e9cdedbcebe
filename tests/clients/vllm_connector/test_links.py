"""A daemon unreachable when vLLM starts is not a refusal: the connector's link answers
misses with one warning (and uses the daemon once it answers)."""

from __future__ import annotations

import logging
import socket

import pytest

from clients.vllm_connector import links
from clients.vllm_connector.config import ConnectorConfig
from kvstore.keys import Namespace, chain_keys

NS = Namespace("LlamaForCausalLM", "r", "float32", "mha", (0,), 1, 8)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_daemon_at_start_is_misses_and_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = ConnectorConfig.from_extra({"store": f"grpc://127.0.0.1:{closed_port()}",
                                      "call_timeout_s": 0.5})
    with caplog.at_level(logging.WARNING, logger="engine.store"):
        link = links.acquire(cfg, lambda tenant: NS)
        try:
            assert links.acquire(cfg, lambda tenant: NS) is link  # one link per process
            keys = chain_keys(NS, list(range(256)))
            assert link.lookup(keys, 0.5).hit_blocks == 0
            assert link.lookup(keys, 0.5).hit_blocks == 0
        finally:
            links.release(cfg)
            links.release(cfg)
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1
