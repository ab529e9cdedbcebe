"""Daemon lifecycle: SIGTERM flushes and exits 0, SSD data survives restarts, bad
flags fail with one line, TLS works end to end."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.errors import StoreUnavailable
from kvstore.testing.daemon_process import REPO, DaemonProcess
from tests.conftest import self_signed_cert, small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads

NS = small_ns()


def ssd_flags(d: Path) -> list[str]:
    return ["--ssd-dir", str(d), "--ssd-capacity", "256MiB", "--dram", "8MiB"]


def test_sigterm_flushes_and_restart_keeps_ssd_data(
    spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    chains = [make_chain(NS, 8, seed=s) for s in range(6)]
    first = spawn_daemon(*ssd_flags(tmp_path / "ssd"))
    with GrpcStore(ClientConfig(target=first.target)) as c:
        c.register(NS)
        for keys in chains:
            assert c.commit(NS, keys, payloads(NS, keys)).inserted == 8
    # SIGTERM right after the commits returned (durability "dram"): shutdown must
    # carry whatever the write-back still holds to SSD before exiting 0.
    assert first.stop() == 0
    assert "stopped" in first.stdout_lines

    second = spawn_daemon(*ssd_flags(tmp_path / "ssd"))
    with GrpcStore(ClientConfig(target=second.target)) as c:
        c.register(NS)
        for keys in chains:
            look = c.lookup(NS, keys)
            assert look.hit_blocks == 8 and set(look.tiers) == {"ssd"}
            dst = bytearray(8 * NS.block_bytes)
            assert c.get_into(NS, keys, dst) == 8
            assert bytes(dst) == b"".join(payloads(NS, keys).values())
        # Promoted by the read: now served from DRAM.
        assert set(c.lookup(NS, chains[0]).tiers) == {"dram"}
        # DeleteNamespace removes the blocks from every tier, SSD included: each of the
        # 48 is on SSD and, promoted by the read above (8 MiB of DRAM holds them all),
        # in DRAM too.
        assert c.delete_namespace(NS) == 2 * 6 * 8
    assert second.stop() == 0
    third = spawn_daemon(*ssd_flags(tmp_path / "ssd"))
    with GrpcStore(ClientConfig(target=third.target)) as c:
        c.register(NS)
        assert all(c.lookup(NS, keys).hit_blocks == 0 for keys in chains)


def test_second_daemon_on_the_same_ssd_dir_fails(spawn_daemon: SpawnDaemon, tmp_path: Path) -> None:
    spawn_daemon(*ssd_flags(tmp_path / "ssd"))
    with pytest.raises(StoreUnavailable, match=r"exited with 2: .*pid"):
        DaemonProcess(ssd_flags(tmp_path / "ssd"))


def serve(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", "serve", *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--nodes", "127.0.0.1:7431", "--replicas", "2"], "cannot hold 2 replicas"),
        (["--replicas", "2"], "give --nodes"),
        (["--nodes", "127.0.0.1:7431", "--write-quorum", "0"], "--write-quorum"),
        (["--dram", "1PiB"], "more than this machine's memory"),
        (["--ssd-dir", "/tmp/x", "--ssd-capacity", str(1 << 70)], "--ssd-capacity must be"),
        (["--listen", "nosuchhost.invalid:7420"], "cannot resolve"),
        (["--metrics-listen", "nosuchhost.invalid:9420"], "--metrics-listen"),
        (["--max-inflight", "0"], "--max-inflight must be positive"),
        (["--dram", "lots"], "invalid size"),
        (["--listen", "nowhere"], "HOST:PORT"),
        (["--ssd-dir", "/tmp/x"], "--ssd-capacity"),
        (["--retention", "soon"], "invalid duration"),
        (["--tls-cert", "/nonexistent"], "--tls-key"),
        (["--access-log-rotate", "5m"], "60"),
        (["--auth-token-file", "/nonexistent/tokens"], "cannot read"),
        # Issue 36: argparse's usage block (item 8), a timeout of nan (item 4).
        (["--workers", "abc"], "kvstore serve: error: --workers: invalid int value: 'abc'"),
        (["--stream-idle-timeout", "nan"], "--stream-idle-timeout: invalid duration 'nan'"),
        (["--dram", "1.5"], "a number of bytes is whole"),
    ],
)
def test_bad_flags_fail_with_one_line(flags: list[str], message: str) -> None:
    r = serve("--listen", "127.0.0.1:0", *flags) if "--listen" not in flags else serve(*flags)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_what_this_machine_refuses_is_one_line(tmp_path: Path) -> None:
    # Issue 14 (item 12): each of these was a traceback and exit 1.
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "bad.pem").write_text("garbage\n")
    cases = [
        (["--listen", f"127.0.0.1:{port}"], "in use"),
        (["--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{port}"], "in use"),
        (["--ssd-dir", str(tmp_path / "file"), "--ssd-capacity", "1GiB"], "not a directory"),
        (["--access-log", str(tmp_path / "file")], "not a directory"),
        (["--shared-fs", str(tmp_path / "file"), "--shared-fs-capacity", "1GiB"], "not a dir"),
        (["--shared-fs", str(tmp_path / "fs"), "--shared-fs-capacity", str(1 << 70)], "must be in"),
        (["--tls-cert", str(tmp_path / "bad.pem"), "--tls-key", str(tmp_path / "bad.pem")], "PEM"),
    ]
    try:
        for flags, message in cases:
            r = serve(*flags) if "--listen" in flags else serve("--listen", "127.0.0.1:0", *flags)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and message in lines[0], (flags, r.stderr)
    finally:
        busy.close()


@pytest.mark.parametrize(
    "toml, message",
    [
        ("dram = true\n", "dram: expected a string or a number"),
        ('shm = "no"\n', "shm: expected true or false"),
        ('workers = "x"\n', "workers: invalid value"),
        ("dram = {a = 1}\n", "dram: expected a string or a number"),
        ("access_log = [[1]]\n", "access_log: expected a list of strings"),
        # A TOML array of nodes is read (here: one replica too many for two nodes).
        ('nodes = ["127.0.0.1:1", "127.0.0.1:2"]\nreplicas = 3\n', "cannot hold 3 replicas"),
    ],
)
def test_toml_values_of_the_wrong_type(tmp_path: Path, toml: str, message: str) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text(toml)
    r = serve("--config", str(cfg), "--listen", "127.0.0.1:0", "--dram", "4MiB")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr


def test_toml_config(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text('dram = "lots"\n')
    r = serve("--config", str(cfg), "--listen", "127.0.0.1:0")
    assert r.returncode == 2 and "invalid size" in r.stderr
    cfg.write_text('dram = "4MiB"\nlisten = "127.0.0.1:0"\nunknown_key = 1\n')
    r = serve("--config", str(cfg))
    assert r.returncode == 2 and "unknown keys unknown_key" in r.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_tls_end_to_end(spawn_daemon: SpawnDaemon, tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    d = spawn_daemon("--tls-cert", str(cert), "--tls-key", str(key))
    keys = make_chain(NS, 2, seed=3)
    cfg = ClientConfig(target=d.target, tls=True, tls_ca_file=str(cert), shm="off")
    with GrpcStore(cfg) as c:
        c.register(NS)
        c.commit(NS, keys, payloads(NS, keys))
        assert c.lookup(NS, keys).hit_blocks == 2
    # A plaintext client cannot talk to a TLS daemon.
    plain = ClientConfig(target=d.target, shm="off", default_timeout_s=2)
    with GrpcStore(plain) as c, pytest.raises(StoreUnavailable):
        c.register(NS)


def test_toml_config_and_non_loopback_warning(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text('dram = "4MiB"\nworkers = 4\n')
    with DaemonProcess(["--config", str(cfg), "--listen", "0.0.0.0:0"]) as d:
        assert any("without --auth-token-file" in line for line in _stderr(d))
        with GrpcStore(ClientConfig(target=d.target)) as c:
            assert c.stats().tiers[0].capacity_bytes == 4 << 20


def _stderr(d: DaemonProcess) -> list[str]:
    """The daemon's stderr so far (read by a thread: give it a moment)."""
    deadline = time.monotonic() + 5
    while not d.stderr_lines and time.monotonic() < deadline:
        time.sleep(0.05)
    return d.stderr_lines
