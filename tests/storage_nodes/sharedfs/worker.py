"""A shared-FS daemon in a child process, for crash and race tests.

``python -m tests.storage_nodes.sharedfs.worker put ROOT ID SEED`` puts chains with
payloads derived from their keys (any reader can check them) until killed, printing
``put N`` after each durable put. ``... collect ROOT ID AFTER_S GO_FILE`` waits for
GO_FILE to exist (so several collectors start together), collects once and prints
the outcome as JSON. ``... lose-last ROOT ID SEED PUTS`` makes PUTS durable puts, then
one more whose slot writes are dropped (its manifest frame still made durable), prints
``lost I`` (that chain's index) and SIGKILLs itself: the state a host crash leaves
between a put's two syncs, a frame durable before its slots.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from storage_nodes.sharedfs import SharedFSConfig, SharedFSTier
from tests.storage_nodes.sharedfs.conftest import NS, chain, rows


def _put(root: str, daemon: str, seed: int, capacity: int) -> None:
    tier = SharedFSTier(SharedFSConfig(root=Path(root), capacity_bytes=capacity,
                                       segment_bytes=capacity // 4, daemon_id=daemon))
    tier.register(NS)
    i = 0
    while True:
        keys = chain(16, seed=seed * 100_000 + i)
        tier.put(NS, keys, rows(keys))
        i += 1
        print(f"put {i}", flush=True)


def _lose_last(root: str, daemon: str, seed: int, puts: int) -> None:
    capacity = 1 << 20
    tier = SharedFSTier(SharedFSConfig(root=Path(root), capacity_bytes=capacity,
                                       segment_bytes=capacity // 4, daemon_id=daemon))
    tier.register(NS)
    for i in range(puts + 1):
        if i == puts:  # the bytes never reach the file system; the frame does
            tier._ctx.io.write_batch = lambda reqs, prepare=None: [0] * len(reqs)  # type: ignore[method-assign]
        keys = chain(16, seed=seed * 100_000 + i)
        if tier.put(NS, keys, rows(keys)).inserted != len(keys):
            raise SystemExit(f"put {i} stored less than {len(keys)} blocks")
    print(f"lost {puts}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _collect(root: str, daemon: str, after_s: float, go: str) -> None:
    tier = SharedFSTier(SharedFSConfig(root=Path(root), capacity_bytes=1 << 20,
                                       segment_bytes=256 << 10, daemon_id=daemon,
                                       collect_after_s=after_s, clock_skew_s=0.0,
                                       lease_s=600.0, maintenance=False))
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.005)
    got = tier.collect()
    tier.close()
    print(json.dumps([{"daemon": g.daemon, "token": g.token, "removed": list(g.removed),
                       "complete": g.complete} for g in got]), flush=True)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "put":
        _put(args[0], args[1], int(args[2]), int(args[3]) if len(args) > 3 else 1 << 20)
    elif cmd == "lose-last":
        _lose_last(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "collect":
        _collect(args[0], args[1], float(args[2]), args[3])
    else:
        raise SystemExit(f"unknown command {cmd!r}")
