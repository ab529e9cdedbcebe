"""Run ``kvstore node`` as a child process on loopback (tests, benchmarks, factories).

The first start binds port 0 and reads ``listening on HOST:PORT`` from stdout (no
port race); ``restart()`` binds that same port again, because a cluster's membership
names nodes by address. ``kill()`` is ``kill -9``. ``file_size_limit_bytes`` sets
``RLIMIT_FSIZE`` in the child: writes past it fail with EFBIG, which the SSD engine
treats as a full disk (tests use it to fill a disk without a special file system). The
spawning itself is ``kvstore.testing.server_process.ServerProcess``'s, shared with the
daemon's harness.
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from pathlib import Path

from kvstore.testing.server_process import REPO, ServerProcess

__all__ = ["REPO", "NodeProcess"]


class NodeProcess(ServerProcess):
    def __init__(
        self,
        directory: Path | str,
        capacity: str | int,
        args: Sequence[str] = (),
        *,
        port: int = 0,
        file_size_limit_bytes: int | None = None,
        start_timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.capacity = str(capacity)
        self.file_size_limit_bytes = file_size_limit_bytes
        super().__init__(
            "node",
            ["--dir", str(self.dir), "--capacity", self.capacity, *args],
            what="node",
            port=port,
            start_timeout_s=start_timeout_s,
            env=env,
            preexec=self._limit_file_size,
        )

    def _limit_file_size(self) -> None:
        if self.file_size_limit_bytes is not None:
            lim = self.file_size_limit_bytes
            resource.setrlimit(resource.RLIMIT_FSIZE, (lim, lim))

    def stop(self, timeout_s: float = 30.0) -> int:
        return super().stop(timeout_s)
