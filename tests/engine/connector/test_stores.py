"""``--kv-store`` openers: an embedded store sized past the machine is one line; a daemon
unreachable at start is asked its tenant again."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from engine.connector.store_link import StoreLink
from engine.connector.stores import StoreOptions, link_for_store, open_store_link
from engine.errors import EngineInputError
from engine.kv.namespace import engine_namespace
from kvstore.keys import Namespace, chain_keys
from kvstore.testing.daemon_process import DaemonProcess
from tests.engine.engine_harness import BT, WrappedStore, dram_store
from tests.engine.fake_model import fake_spec


def test_more_dram_than_the_machine_has_is_refused_before_the_store_opens(
    tmp_path: Path,
) -> None:
    # Issue 36 (item 1): kvengine's embedded store, like kvstore serve/demo/loadgen, got
    # numpy's _ArrayMemoryError traceback; now the shared check of kvstore.host.
    where = tmp_path / "store"
    with pytest.raises(EngineInputError, match=r"--dram 1024\.0 TiB is more than this machine"):
        open_store_link(
            f"embedded:{where}", lambda tenant: pytest.fail("no namespace"),
            StoreOptions(dram_bytes=1 << 50),
        )
    assert not where.exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_ns(tenant: str) -> Namespace:
    return engine_namespace(fake_spec(), BT, tenant)


def test_a_daemon_unreachable_at_start_is_asked_its_tenant_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 33: a daemon with auth that is not up yet when the engine opens its link
    (started by the same script, say). The tenant was silently "" and the daemon then
    refused every call; now the link asks again, says so, and gets the token's tenant."""
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-token-of-team-a team-a\n")
    port = free_port()
    opened: dict[str, StoreLink] = {}

    def open_link() -> None:
        opened["link"] = open_store_link(f"grpc://127.0.0.1:{port}", fake_ns,
                                         StoreOptions(auth_token_file=str(tokens)))

    caplog.set_level(logging.WARNING, logger="engine.store")
    opener = threading.Thread(target=open_link)
    opener.start()
    for _ in range(100):  # until the first refusal was said (bounded: the old code never)
        if "asking it for its tenant again" in caplog.text or not opener.is_alive():
            break
        time.sleep(0.1)
    with DaemonProcess(["--dram", "16MiB", "--auth-token-file", str(tokens),
                        "--listen", f"127.0.0.1:{port}"]):
        opener.join(60)
        link = opened["link"]
        try:
            assert "asking it for its tenant again" in caplog.text
            assert link.ns.tenant == "team-a"
            keys = chain_keys(link.ns, list(range(BT)))
            res = link.commit(keys, {0: bytes(link.ns.block_bytes)}, 5.0)
            assert res.inserted == 1 and link.counters()["store_errors_total"] == 0
        finally:
            link.close()


class LateStore(WrappedStore):
    """A store that cannot say its tenant while ``dead``, then names ``tenant``."""

    def __init__(self, tenant: str) -> None:
        super().__init__(dram_store())
        self.answer = tenant

    def tenant(self, *, timeout_s: float | None = None) -> str:
        self._alive()
        return self.answer


@pytest.mark.parametrize("tenant", ["team-a", ""])
def test_a_tenant_learned_after_start_is_checked_before_the_store_is_used(
    tenant: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = LateStore(tenant)
    store.dead = True
    caplog.set_level(logging.INFO, logger="engine.store")
    link = link_for_store(store, "late", fake_ns, StoreOptions(identity_wait_s=0))
    try:
        assert link.ns.tenant == "" and link.enabled
        keys = chain_keys(link.ns, list(range(BT)))
        assert link.lookup(keys, 1.0).hit_blocks == 0  # still down: a miss
        store.dead = False
        res = link.commit(keys, {0: bytes(link.ns.block_bytes)}, 1.0)
        if tenant:  # the namespaces are not the token's: warned once, then left alone
            assert res.inserted == 0 and not link.enabled
            assert "maps this engine's token to tenant 'team-a'" in caplog.text
            assert store.commits == []
        else:
            assert res.inserted == 1 and link.enabled
    finally:
        link.close()
        store.inner.close()
