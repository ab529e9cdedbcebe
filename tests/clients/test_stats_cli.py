"""``kvstore stats`` against a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.cli import main
from kvstore.testing.daemon_process import REPO, DaemonProcess


def stats(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", "stats", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_text_and_json(shared_daemon: DaemonProcess) -> None:
    r = stats("--store", shared_daemon.url, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tiers"][0]["name"] == "dram" and doc["tiers"][0]["capacity_bytes"] == 32 << 20
    r = stats("--store", shared_daemon.url)
    assert r.returncode == 0 and r.stdout.startswith("dram: ") and "store:" in r.stdout


def test_errors_are_one_line() -> None:
    for args in (
        ["--store", "http://x:1"],
        ["--store", "grpc://127.0.0.1:1", "--timeout", "0.5"],
        ["--auth-token-file", "/nonexistent"],
    ):
        r = stats(*args)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_a_timeout_is_finite_and_positive(capsys: pytest.CaptureFixture[str], value: str) -> None:
    # Issue 36 (item 4): nan and inf were accepted and ended in "Deadline Exceeded".
    with pytest.raises(SystemExit) as e:
        main(["stats", "--store", "grpc://127.0.0.1:1", f"--timeout={value}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"kvstore stats: error: --timeout: invalid duration '{value}'"
    ), err


def test_a_bad_ca_file_is_named_before_connecting(tmp_path: Path) -> None:
    # Issue 36 (item 2): four gRPC C-core log lines, then "Connection refused".
    bad = tmp_path / "BAD.pem"
    bad.write_text("not a pem\n")
    r = stats("--store", "grpcs://127.0.0.1:1", "--tls-ca", str(bad), "--timeout", "2")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"kvstore stats: error: TLS CA file {bad}: holds no PEM certificate"
    ]


def test_client_commands_keep_grpc_core_logging_off_the_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    assert main(["stats", "--store", "http://x:1"]) == 2
    assert os.environ.get("GRPC_VERBOSITY") == "NONE"
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")  # an operator's own choice wins
    assert main(["stats", "--store", "http://x:1"]) == 2
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"


def test_a_tier_that_cannot_count_a_tenants_blocks_is_not_shown_as_empty() -> None:
    from clients.stats_cli import render
    from kvstore.tier import StoreStats, TierStats

    tiers = (
        TierStats("dram", 1 << 20, 4096, (), info={"scope": "tenant", "held": "exact"}),
        TierStats("cluster", 1 << 30, 0, (), info={"scope": "tenant", "held": "unknown"}),
    )
    lines = render(StoreStats(tiers=tiers, counters={})).splitlines()
    assert lines[0] == "dram: 4.0 KiB of 1.0 MiB (0.4%)"
    assert lines[1] == "cluster: this tenant's share not counted by the tier, of 1.0 GiB"
