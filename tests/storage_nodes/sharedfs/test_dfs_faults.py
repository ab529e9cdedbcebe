"""Faults on a real distributed file system (tests/dfs; skipped where none can run,
failing under KVSTORE_REQUIRE_DFS=1): a data server SIGKILLed under load, a daemon
SIGKILLed mid-write, two collectors racing for one dead daemon."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.dfs.cluster import cluster_or_skip
from tests.storage_nodes.sharedfs.conftest import NS, chain, rows
from tests.storage_nodes.sharedfs.daemons import Daemon, daemons_on, start_daemon


def _payloads(keys: list[bytes]) -> dict[int, bytes]:
    return {j: rows([k]) for j, k in enumerate(keys)}


def _wait_for(done, what: str, deadline_s: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    """Until ``done()``; the deadline only catches a hang."""
    t0 = time.monotonic()
    while not done():
        assert time.monotonic() - t0 < deadline_s, f"no {what} within {deadline_s} s"
        time.sleep(0.05)


@pytest.mark.parametrize("where", ["moosefs", "glusterfs"])
def test_a_data_server_killed_under_load_costs_no_bytes_and_no_errors(where) -> None:
    c = cluster_or_skip(where)
    name = f"kill-{uuid.uuid4().hex[:8]}"
    stop, killed = threading.Event(), threading.Event()
    lock = threading.Lock()
    committed: list[tuple[int, list[bytes]]] = []
    errors: list[str] = []
    wrong: list[str] = []
    after = Counter[str]()

    def writer(d: Daemon, idx: int) -> None:
        i = 0
        while not stop.is_set():
            keys = chain(8, seed=idx * 1_000_000 + i)
            i += 1
            try:
                res = d.store.commit(NS, keys, _payloads(keys), durability="ssd", timeout_s=60)
            except Exception as e:
                errors.append(f"{d.ident} commit: {e!r}")
                continue
            with lock:
                committed.append((idx, keys))
            if killed.is_set():
                after["inserted"] += res.inserted

    def reader(d: Daemon, idx: int) -> None:
        rnd, seen = random.Random(idx), set()
        dst = bytearray(8 * NS.block_bytes)
        while not stop.is_set():
            with lock:
                fresh = [k for w, k in committed if w != idx and k[0] not in seen]
            if not fresh:
                time.sleep(0.01)
                continue
            keys = rnd.choice(fresh[-20:])
            seen.add(keys[0])
            try:
                look = d.store.lookup(NS, keys, timeout_s=60)
                n = d.store.get_into(NS, keys, dst, timeout_s=60)
            except Exception as e:
                errors.append(f"{d.ident} read: {e!r}")
                continue
            if bytes(dst[: n * NS.block_bytes]) != rows(keys[:n]):
                wrong.append(f"{d.ident}: wrong bytes for {keys[0].hex()}")
            if n == 0:
                seen.discard(keys[0])  # not visible here yet: read it again later
            if killed.is_set():
                after["ssd_hits"] += sum(1 for t in look.tiers[:n] if t == "ssd")

    with daemons_on([m / name for m in c.mounts]) as ds:
        threads = [threading.Thread(target=f, args=(d, i)) for i, d in enumerate(ds)
                   for f in (writer, reader)]
        for t in threads:
            t.start()
        try:
            # Progress, not time, moves the test on (a loaded CI machine is slow): some
            # commits before the kill, then reads and writes served after it.
            _wait_for(lambda: len(committed) >= 6 or bool(errors), "commits before the kill")
            pid = c.kill_server(1)
            killed.set()
            time.sleep(2)  # reads and writes keep going while the server is down
            _wait_for(lambda: (after["ssd_hits"] > 0 and after["inserted"] > 0) or errors,
                      f"reads and writes served after server {pid} died")
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
            c.restart_servers()
        stats = [d.store.stats(timeout_s=30) for d in ds]
    ssd = [next(t for t in s.tiers if t.name == "ssd").counters for s in stats]
    assert errors == [] and wrong == []
    assert after["ssd_hits"] > 0, f"no reads served from {where} after server {pid} died"
    assert after["inserted"] > 0, f"no writes landed on {where} after server {pid} died"
    assert sum(s["corrupt_blocks_total"] for s in ssd) == 0


@pytest.mark.parametrize("where", ["moosefs", "glusterfs"])
def test_a_daemon_killed_mid_write_leaves_nothing_readable_that_is_wrong(where) -> None:
    c = cluster_or_skip(where)
    name = f"crash-{uuid.uuid4().hex[:8]}"
    r1, r2 = c.mounts[0] / name, c.mounts[1] / name
    writer = start_daemon(r1, "w", capacity="8MiB")  # small: slots get reused
    reader = start_daemon(r2, "r")
    tried: list[list[bytes]] = []
    done = threading.Event()

    def commit_forever() -> None:
        i = 0
        while not done.is_set():
            keys = chain(16, seed=7_000_000 + i)
            i += 1
            tried.append(keys)
            try:
                writer.store.commit(NS, keys, _payloads(keys), durability="ssd", timeout_s=30)
            except Exception:
                return  # the daemon is gone: what it left is checked below

    t = threading.Thread(target=commit_forever)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while len(tried) < 150 and time.monotonic() < deadline:  # past capacity: reuse
            time.sleep(0.05)
        writer.proc.proc.send_signal(signal.SIGKILL)
        done.set()
        t.join(timeout=60)
        writer.proc.kill()
        writer.store.close()
        again = start_daemon(r1, "w", capacity="8MiB")  # adopts what it published
        try:
            served = 0
            dst = bytearray(16 * NS.block_bytes)
            time.sleep(2)  # past the visibility bound for the reader
            for keys in tried:
                for d in (again, reader):
                    n = d.store.get_into(NS, keys, dst, timeout_s=60)
                    assert bytes(dst[: n * NS.block_bytes]) == rows(keys[:n]), d.ident
                    served += n
            assert served > 0
            ssd = next(t for t in again.store.stats(timeout_s=30).tiers if t.name == "ssd")
            assert ssd.counters["blocks"] > 0
        finally:
            again.close()
    finally:
        done.set()
        reader.close()
        writer.proc.kill()


@pytest.mark.parametrize("where", ["moosefs", "glusterfs"])
def test_two_collectors_never_collect_the_same_dead_daemon(where, tmp_path) -> None:
    c = cluster_or_skip(where)
    name = f"collect-{uuid.uuid4().hex[:8]}"
    roots = [m / name for m in c.mounts]
    dead = subprocess.Popen([sys.executable, "-m", "tests.storage_nodes.sharedfs.worker",
                             "put", str(roots[0]), "gone", "3"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert dead.stdout is not None
        while int(dead.stdout.readline().split()[1]) < 10:
            pass
    finally:
        dead.kill()
        dead.wait()

    def rel(path: Path | str) -> str:
        p = Path(path)
        root = next(r for r in roots if p.is_relative_to(r))
        return str(p.relative_to(root))

    files = {rel(p) for p in roots[1].rglob("*")
             if p.is_file() and "gone" in p.parts and "leases" not in p.parts}
    assert any("seg-" in f for f in files) and any("manifest-" in f for f in files)
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-m", "tests.storage_nodes.sharedfs.worker",
                               "collect", str(root), ident, "0.5", str(go)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
             for root, ident in ((roots[1], "c2"), (roots[2], "c3"))]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the dead daemon's heartbeat is now older than 0.5 s
        go.touch()  # both collectors start at once, on two FUSE clients
        outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1])
                for p in procs]
    finally:
        for p in procs:
            p.kill()
    mine = [[g for g in out if g["daemon"] == "gone"] for out in outs]
    winners = [m for m in mine if m and m[0]["removed"]]
    assert len(winners) == 1, f"collections of the dead daemon: {mine}"
    assert winners[0][0]["complete"]
    assert files <= {rel(f) for f in winners[0][0]["removed"]}
    gone = roots[1] / "daemons" / "gone"
    # Another client's view lags by its entry cache (1 s); the generous deadline is only
    # for a loaded machine, the loop ends as soon as the directory is gone.
    deadline = time.monotonic() + 30
    while gone.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not gone.exists(), sorted(p.name for p in gone.iterdir())
