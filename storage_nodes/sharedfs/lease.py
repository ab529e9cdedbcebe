"""Fencing tokens on a daemon's data: ``leases/<id>/token-<T>``.

Tokens are created with ``O_CREAT | O_EXCL`` (atomic on every POSIX distributed file
system: the metadata server serialises creates), so each number has exactly one holder,
and numbers only grow. Two kinds:

* ``owner``: taken by daemon ``<id>`` each time it starts; its number is the epoch in
  its new segment ids. It fences every collector holding a lower token.
* ``collect``: taken by a live daemon that found ``<id>`` gone; valid until
  ``expires_s`` by the holder's clock. Others treat it as expired only once their
  clock passes ``expires_s + clock_skew_s``; the holder stops acting at
  ``expires_s - clock_skew_s``. With clocks within ``clock_skew_s`` of each other, two
  collectors never act at once.

Before every destructive step the holder calls ``check``: if a higher token exists (a
newer collector, or the owner came back) or its time is up, ``LeaseLost`` stops it.
Correctness of reads never depends on this (every read is header-verified); the lease
keeps collectors from doing the work twice and from deleting a returning daemon's files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgpack

from storage_nodes.sharedfs.errors import LeaseLost
from storage_nodes.sharedfs.layout import Layout

_TOKEN_RE = re.compile(r"^token-(\d{10})$")


@dataclass(frozen=True, slots=True)
class TokenInfo:
    token: int
    holder: str
    kind: str  # "owner" | "collect"
    expires_s: float
    done: bool


def token_path(d: Path, token: int) -> Path:
    return d / f"token-{token:010d}"


def tokens(d: Path) -> list[int]:
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in (_TOKEN_RE.match(n) for n in names) if m)


def read_token(d: Path, token: int) -> TokenInfo | None:
    try:
        raw = token_path(d, token).read_bytes()
        v = msgpack.unpackb(raw, raw=False)
        return TokenInfo(token, str(v["holder"]), str(v["kind"]), float(v["expires_s"]),
                         bool(v["done"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # being written, or torn: counts as held


def _write(path: Path, info: TokenInfo, *, create: bool) -> None:
    raw = msgpack.packb(
        {"holder": info.holder, "kind": info.kind, "expires_s": info.expires_s,
         "done": info.done},
        use_bin_type=True,
    )
    flags = os.O_WRONLY | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)


def claim_owner(layout: Layout, daemon: str) -> int:
    """Take the next token as the owner of ``daemon`` (at every start); returns it."""
    d = layout.lease_dir(daemon)
    d.mkdir(parents=True, exist_ok=True)
    while True:
        token = max(tokens(d), default=0) + 1
        try:
            _write(token_path(d, token), TokenInfo(token, daemon, "owner", 0.0, False),
                   create=True)
            return token
        except FileExistsError:
            continue  # a collector took that number: take the next one


class Lease:
    """A held ``collect`` token."""

    def __init__(self, d: Path, info: TokenInfo, lease_s: float, skew_s: float) -> None:
        self.dir = d
        self.info = info
        self.lease_s = lease_s
        self.skew_s = skew_s

    @property
    def token(self) -> int:
        return self.info.token

    def check(self, now_s: float) -> None:
        top = max(tokens(self.dir), default=0)
        if top != self.info.token:
            raise LeaseLost(f"token {self.info.token} fenced by token {top} in {self.dir}")
        if now_s > self.info.expires_s - self.skew_s:
            raise LeaseLost(f"lease {self.info.token} in {self.dir} ran out")

    def renew(self, now_s: float) -> None:
        self.check(now_s)
        info = TokenInfo(self.info.token, self.info.holder, "collect", now_s + self.lease_s,
                         False)
        _write(token_path(self.dir, info.token), info, create=False)
        self.info = info

    def finish(self) -> None:
        info = TokenInfo(self.info.token, self.info.holder, "collect", self.info.expires_s,
                         True)
        _write(token_path(self.dir, info.token), info, create=False)
        self.info = info


def acquire(layout: Layout, daemon: str, holder: str, lease_s: float, skew_s: float,
            now_s: float) -> Lease | None:
    """Take the next ``collect`` token on ``daemon``'s data, or None if a collector's
    unexpired lease stands or another collector won the race for the number."""
    d = layout.lease_dir(daemon)
    d.mkdir(parents=True, exist_ok=True)
    top = max(tokens(d), default=0)
    if top:
        info = read_token(d, top)
        if info is None:
            return None
        if info.kind == "collect" and not info.done and now_s <= info.expires_s + skew_s:
            return None
    mine = TokenInfo(top + 1, holder, "collect", now_s + lease_s, False)
    try:
        _write(token_path(d, mine.token), mine, create=True)
    except FileExistsError:
        return None
    return Lease(d, mine, lease_s, skew_s)
