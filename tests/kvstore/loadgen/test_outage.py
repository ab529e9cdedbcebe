"""``kvstore loadgen`` against a daemon with auth, and through an outage in its durability
audit (issue 14, item 12)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from clients.config import config_from_url
from clients.sync_client import GrpcStore
from kvstore.loadgen.load import LoadConfig, LoadRun
from kvstore.loadgen.session import StoreSession
from kvstore.testing.daemon_process import DaemonProcess
from tests.kvstore.daemon.conftest import write_tokens
from tests.kvstore.loadgen.test_daemon import assert_equals_prediction, daemons, loadgen

__all__ = ["daemons"]  # the fixture, used below


def test_a_daemon_with_auth_gets_the_tokens_tenant(
    tmp_path: Path,
    conv_trace: Path,
    daemons: list[DaemonProcess],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: every namespace had tenant "" and the daemon refused all of them.
    tokens = write_tokens(tmp_path / "tokens", ["loadgen"])
    (tmp_path / "mine").write_text(tokens["loadgen"] + "\n")
    d = DaemonProcess(["--dram", "32MiB", "--auth-token-file", str(tmp_path / "tokens")])
    daemons.append(d)
    body = loadgen(
        capsys,
        conv_trace,
        d.url,
        "--bytes-per-token",
        "4",
        "--auth-token-file",
        str(tmp_path / "mine"),
    )
    assert_equals_prediction(body)
    assert body["hit_tokens"] > 0


def test_the_durability_audit_waits_out_a_2s_outage(tmp_path: Path, conv_trace: Path) -> None:
    flags = ["--dram", "1MiB", "--ssd-dir", str(tmp_path / "ssd"), "--ssd-capacity", "64MiB"]
    first = DaemonProcess(flags)
    second: list[DaemonProcess] = []
    cfg = config_from_url(first.url, default_timeout_s=1.0)
    session = StoreSession(lambda: GrpcStore(cfg), reopenable=True, timeout_s=1.0)
    try:
        load = LoadRun(
            LoadConfig(inputs=(str(conv_trace),), bytes_per_token=4, durability="ssd"),
            session,
        )
        load.run()
        acked = len(load.ledger)
        # A replay without errors acknowledges every block of the trace durable, once each.
        assert acked == len({k for tr in load.items() for k in tr.keys}) > 0
        first.kill()  # kill -9; the daemon is back 2 s later, on the same port
        restart = threading.Timer(
            2.0,
            lambda: second.append(DaemonProcess([*flags, "--listen", f"127.0.0.1:{first.port}"])),
        )
        restart.start()
        t0 = time.monotonic()
        audit = load.ledger.audit(session, load.payloads)
        restart.join()
        assert time.monotonic() - t0 >= 2.0  # it did meet the outage
        assert (audit.checked, audit.missing, audit.wrong_bytes) == (acked, 0, 0)
    finally:
        session.close()
        first.kill()
        for d in second:
            d.stop()
