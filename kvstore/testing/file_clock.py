"""A monotonic clock that a test moves by hand, shared with a daemon in another process.

The daemon's stream idle deadline (``IdleWatchdog``) reads it instead of
``time.monotonic``, so a test decides when a held stream has been idle past the
deadline: after the daemon has read what the test sent, not when the scheduler says.
The time is a number in a small file, replaced atomically on every move.

``python -m kvstore.testing.file_clock FILE serve ARGS...`` runs ``kvstore serve ARGS...``
on that clock (``DaemonProcess(..., clock_file=FILE)`` does this).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path


class FileClock:
    """Seconds read from ``path``; ``advance`` moves them forward for every reader."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, path: Path, start_s: float = 0.0) -> FileClock:
        clock = cls(path)
        clock._write(start_s)
        return clock

    def __call__(self) -> float:
        return float(self.path.read_text())

    def advance(self, s: float) -> None:
        if s < 0:
            raise ValueError("a monotonic clock never goes back")
        self._write(self() + s)

    def _write(self, t: float) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(repr(t))
        os.replace(tmp, self.path)  # a reader sees the old time or the new, never half


def main(argv: Sequence[str]) -> int:
    path, command, *rest = argv
    if command != "serve":
        raise SystemExit(f"usage: python -m {__name__} FILE serve ARGS...")
    from kvstore.cli import build_parser
    from kvstore.daemon.cli import config_from_args
    from kvstore.daemon.server import run_daemon

    parser, _ = build_parser("serve")
    return run_daemon(
        config_from_args(parser.parse_args(["serve", *rest])), clock=FileClock(Path(path))
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
