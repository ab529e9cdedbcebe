"""Real ``kvstore serve --shared-fs`` daemons for the multi-host tests: each on its own
mount of the same file system (as each host has its own), each reached by a client."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.testing.daemon_process import DaemonProcess
from tests.storage_nodes.sharedfs.conftest import NS


@dataclass
class Daemon:
    ident: str
    root: Path
    proc: DaemonProcess
    store: GrpcStore

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.store.close()
        self.proc.stop()


def start_daemon(root: Path, ident: str, *, dram: str = "8MiB", capacity: str = "64MiB",
                 extra: Sequence[str] = ()) -> Daemon:
    proc = DaemonProcess(["--dram", dram, "--shared-fs", str(root), "--shared-fs-capacity",
                          capacity, "--shared-fs-id", ident, "--no-shm", *extra])
    store = GrpcStore(ClientConfig(target=proc.target, shm="off", default_timeout_s=60.0))
    store.register(NS, timeout_s=60)
    return Daemon(ident, root, proc, store)


@contextlib.contextmanager
def daemons_on(roots: Sequence[Path], **kw: object) -> Iterator[list[Daemon]]:
    """One daemon per root (``d1``, ``d2``, …): the first alone (it creates the root and
    the namespace's directory, as storage_nodes/sharedfs/README.md rule 11 asks on
    GlusterFS), the others in parallel; all stopped in parallel."""
    with ThreadPoolExecutor(len(roots)) as pool:
        first = pool.submit(start_daemon, roots[0], "d1", **kw)  # type: ignore[arg-type]
        first.exception()
        futures = [first] + [pool.submit(start_daemon, root, f"d{i}", **kw)  # type: ignore[arg-type]
                             for i, root in enumerate(roots[1:], start=2)]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        for f in futures:
            f.result()  # raises the first start that failed (the others get stopped)
        yield started
    finally:
        for d in started:
            d.proc.proc.terminate()
        for d in started:
            d.close()
