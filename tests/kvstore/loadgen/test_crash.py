"""kill -9 of the daemon mid-replay, restart on the same port and SSD directory: no block
acknowledged with ``durability="ssd"`` is lost, and no wrong byte is ever served."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kvstore.loadgen.load import LoadConfig, LoadRun
from kvstore.loadgen.session import StoreSession
from kvstore.testing.daemon_process import DaemonProcess
from tests.kvstore.loadgen.synthetic import conversation_trace


def test_kill_9_mid_replay_loses_no_durable_block(tmp_path: Path) -> None:
    from clients.config import config_from_url
    from clients.sync_client import GrpcStore

    # ~480 requests spread over ~9.6 s of trace time, replayed at 2x: ~5 s of load.
    trace = conversation_trace(tmp_path / "conv.jsonl", conversations=60, turns=8)
    flags = ["--dram", "1MiB", "--ssd-dir", str(tmp_path / "ssd"), "--ssd-capacity", "256MiB"]
    first = DaemonProcess(flags)
    second: DaemonProcess | None = None
    try:
        cfg = config_from_url(first.url, default_timeout_s=2.0)
        session = StoreSession(lambda: GrpcStore(cfg), reopenable=True, timeout_s=2.0)
        load = LoadRun(
            LoadConfig(
                inputs=(str(trace),),
                bytes_per_token=4,
                verify=True,
                durability="ssd",
                speed=2.0,
                audit=True,
            ),
            session,
        )
        box: dict[str, object] = {}
        runner = threading.Thread(target=lambda: box.setdefault("report", load.run()))
        runner.start()
        deadline = time.monotonic() + 30
        while len(load.ledger) < 100 and time.monotonic() < deadline:
            time.sleep(0.02)
        acked_before_kill = len(load.ledger)
        requests_before_kill = load.tally.requests
        first.kill()  # kill -9: no flush, no goodbye
        # The restart waits until the replay has met the dead daemon, so the outage is
        # seen whatever the machine's load (a restart racing ahead of the next call would
        # hide it behind gRPC's reconnect).
        deadline = time.monotonic() + 60
        while not load.tally.errors["unavailable"] and time.monotonic() < deadline:
            time.sleep(0.02)
        second = DaemonProcess([*flags, "--listen", f"127.0.0.1:{first.port}"])
        runner.join(timeout=120)
        assert not runner.is_alive()
        report = box["report"]
        body = report.to_json()  # type: ignore[attr-defined]
        session.close()
    finally:
        first.kill()
        if second is not None:
            second.stop()
    assert acked_before_kill >= 100
    assert 0 < requests_before_kill < body["requests"]  # the kill landed mid-replay
    assert body["requests"] == body["predicted"]["requests"]
    # Calls during the outage are counted, and the first call after one opens a new client.
    assert body["errors"]["unavailable"] > 0
    assert body["load"]["store_reopens"] > 0
    assert body["wrong_bytes"] == 0
    audit = body["audit"]
    # Every block acknowledged durable before, during and after the crash reads back intact.
    distinct = body["load"]["durable_distinct_blocks"]
    assert audit["checked"] == distinct > acked_before_kill
    assert body["load"]["durable_acked_blocks"] >= distinct
    assert audit["missing"] == 0 and audit["wrong_bytes"] == 0
    # After the restart the SSD still served hits for blocks written before the kill.
    assert body["tiers"]["ssd"]["hit_tokens"] > 0
