"""A daemon unreachable when vLLM starts is not a refusal: the connector's link answers
misses with one warning (and uses the daemon once it answers)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from clients.vllm_connector import links
from clients.vllm_connector.config import ConnectorConfig
from kvstore.keys import Namespace, chain_keys
from kvstore.testing.daemon_process import DaemonProcess

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


def test_a_daemon_started_just_after_vllm_is_used_from_the_first_call(
        caplog: pytest.LogCaptureFixture) -> None:
    """The connector opens its link through the engine's path (``open_store_link``, the
    sync client): its first call waits for a daemon that is starting (``kvstore.wire.contact``)
    instead of failing on the channel's reconnect backoff."""
    port = closed_port()
    cfg = ConnectorConfig.from_extra({"store": f"grpc://127.0.0.1:{port}",
                                      "call_timeout_s": 120})
    acquired: list[object] = []
    with caplog.at_level(logging.WARNING, logger="engine.store"):
        opener = threading.Thread(target=lambda: acquired.append(links.acquire(cfg, lambda t: NS)))
        opener.start()  # vLLM starts: it asks the daemon its tenant
        time.sleep(1.0)
        with DaemonProcess(["--dram", "16MiB", "--listen", f"127.0.0.1:{port}"]):
            opener.join(180)
            (link,) = acquired
            try:
                keys = chain_keys(NS, list(range(256)))[:1]
                res = link.commit(keys, {0: bytes(NS.block_bytes)}, 5.0)
                assert res.inserted == 1, (res, link.counters(), caplog.text)
                assert link.lookup(keys, 5.0).hit_blocks == 1
                assert link.counters()["store_errors_total"] == 0
            finally:
                links.release(cfg)
    assert not [r for r in caplog.records if "unreachable" in r.getMessage()]
