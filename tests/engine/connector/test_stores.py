"""``--kv-store`` openers: an embedded store sized past the machine is one line; a daemon
unreachable at start is asked its tenant again."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from clients.breaker import BreakerConfig, CircuitBreaker
from engine.connector.store_link import StoreLink
from engine.connector.stores import StoreOptions, link_for_store, open_store_link
from engine.errors import EngineInputError
from engine.kv.namespace import engine_namespace
from kvstore.errors import StoreUnavailable
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


def fake_ns(tenant: str) -> Namespace:
    return engine_namespace(fake_spec(), BT, tenant)


class Doorway:
    """A loopback port that refuses connections (bound, not listening: what a daemon not
    up yet looks like) until ``open()``, then forwards each connection to ``target``.

    The daemon behind it is started and ready before the engine asks, so how long a
    loaded machine takes to start it no longer eats the engine's retry window: the
    store turns reachable at a moment the test picks."""

    def __init__(self) -> None:
        self._gate = socket.socket()
        self._gate.bind(("127.0.0.1", 0))
        self.port = int(self._gate.getsockname()[1])
        self._socks: list[socket.socket] = []

    def open(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._gate.listen()
        threading.Thread(target=self._accept, args=((host, int(port)),), daemon=True).start()

    def _accept(self, upstream: tuple[str, int]) -> None:
        while True:
            try:
                down, _ = self._gate.accept()
            except OSError:  # closed
                return
            up = socket.create_connection(upstream)
            self._socks += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def __enter__(self) -> Doorway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for s in [self._gate, *self._socks]:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(1 << 16):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def test_a_daemon_unreachable_at_start_is_asked_its_tenant_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 33: a daemon with auth that is not up yet when the engine opens its link
    (started by the same script, say). The tenant was silently "" and the daemon then
    refused every call; now the link asks again, says so, and gets the token's tenant.

    The daemon becomes reachable only after the engine said it would ask again (the
    first refusal), and then at once: the daemon runs already, behind a ``Doorway``."""
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-token-of-team-a team-a\n")
    opened: dict[str, StoreLink] = {}
    caplog.set_level(logging.WARNING, logger="engine.store")
    with Doorway() as door, DaemonProcess(
        ["--dram", "16MiB", "--auth-token-file", str(tokens)]
    ) as daemon:

        def open_link() -> None:
            opened["link"] = open_store_link(f"grpc://127.0.0.1:{door.port}", fake_ns,
                                             StoreOptions(auth_token_file=str(tokens)))

        opener = threading.Thread(target=open_link)
        opener.start()
        try:
            said = threading.Event()
            handler = _OnRecord("asking it for its tenant again", said)
            logging.getLogger("engine.store").addHandler(handler)
            try:  # bounded: the old code never said it
                assert said.wait(60) or not opener.is_alive(), "no refusal was said"
            finally:
                logging.getLogger("engine.store").removeHandler(handler)
            door.open(daemon.target)
        finally:
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


class _OnRecord(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is logged."""

    def __init__(self, text: str, event: threading.Event) -> None:
        super().__init__()
        self.text, self.event = text, event

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


class SkippingStore(WrappedStore):
    """A client's view of a daemon that comes up right after the first ask failed: the
    client's circuit breaker, opened by that failure, skips every ask (``CircuitOpen``)
    for ``cooldown_s``, longer than the engine's whole identity wait."""

    def __init__(self, cooldown_s: float) -> None:
        super().__init__(dram_store())
        self.breaker = CircuitBreaker(BreakerConfig(failure_threshold=1, cooldown_s=cooldown_s))
        self.asked = 0  # asks the breaker let through

    def tenant(self, *, timeout_s: float | None = None) -> str:
        self.breaker.before_call()
        self.asked += 1
        if self.asked == 1:
            self.breaker.on_failure()
            raise StoreUnavailable("test: not up yet")
        self.breaker.on_success()
        return "team-a"


def test_the_identity_wait_ends_with_a_real_ask_not_a_skipped_one() -> None:
    """Every ask after the first fell in the breaker's cool-down, the one at the
    deadline too: the engine used to give up without having asked the daemon since it
    came up (tenant ""). Now it asks once the breaker lets the call through."""
    store = SkippingStore(cooldown_s=1.0)
    link = link_for_store(store, "late", fake_ns, StoreOptions(identity_wait_s=0.3))
    try:
        assert link.ns.tenant == "team-a"
        assert store.asked == 2
    finally:
        link.close()
        store.inner.close()


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


def test_a_daemon_started_just_after_the_engine_is_used_from_the_first_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``kvengine serve --kv-store grpc://…`` and ``kvstore serve`` started together: the
    engine's first ask (its tenant) waits for the daemon within its deadline
    (``kvstore.wire.contact``) instead of failing on the channel's reconnect backoff, so the
    link starts with the daemon's tenant, no counted failure and no warning."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    opened: list[StoreLink] = []
    caplog.set_level(logging.WARNING, logger="engine.store")
    opener = threading.Thread(target=lambda: opened.append(open_store_link(
        f"grpc://127.0.0.1:{port}", fake_ns, StoreOptions(call_timeout_s=120))))
    opener.start()
    time.sleep(1.0)  # the engine is asking; nothing listens yet
    with DaemonProcess(["--dram", "16MiB", "--listen", f"127.0.0.1:{port}"]):
        opener.join(180)
        (link,) = opened
        try:
            keys = chain_keys(link.ns, list(range(BT)))
            assert link.commit(keys, {0: bytes(link.ns.block_bytes)}, 5.0).inserted == 1
            assert link.counters()["store_errors_total"] == 0
        finally:
            link.close()
    assert "unreachable" not in caplog.text
