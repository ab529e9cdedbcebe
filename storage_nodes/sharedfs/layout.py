"""Where everything lives on the mount (one ``root`` shared by every daemon).

::

    ROOT/FORMAT                                   "kvstore-sharedfs 1"
    ROOT/daemons/<id>/LOCK                        flock'ed by the daemon <id> while it runs
    ROOT/daemons/<id>/HEARTBEAT                   its liveness record (heartbeat.py)
    ROOT/leases/<id>/token-<T>                    fencing tokens for <id>'s data (lease.py)
    ROOT/tenants/<tenant>/<fingerprint>/<id>/manifest-<G>.log   what <id> stored (manifest.py)
    ROOT/tenants/<tenant>/<fingerprint>/<id>/seg-<S>            <id>'s segment files

Everything under ``tenants/<tenant>/`` belongs to one tenant, so the file system's
permissions (the directory is created ``tenant_dir_mode``, 0700 by default) can fence
tenants; a namespace's files sit in one directory per writing daemon, so a daemon lists
one directory to find every peer that holds the namespace. No two daemons ever write
the same file: a daemon writes only under its own ``<id>`` directories (and its own
heartbeat and lease tokens).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote, unquote

from storage_nodes.sharedfs.errors import SharedFSConfigError

FORMAT_TEXT = "kvstore-sharedfs 1\n"
_DEFAULT_TENANT = "@default"
_MANIFEST_RE = re.compile(r"^manifest-(\d{10})\.log$")
_SEGMENT_RE = re.compile(r"^seg-([0-9a-f]{16})$")


def tenant_dir_name(tenant: str) -> str:
    """A tenant as one path component: percent-encoded, ``@default`` for ``""`` (``@`` is
    always encoded in a real name, so the two never collide)."""
    return _DEFAULT_TENANT if tenant == "" else quote(tenant, safe="")


def tenant_of_dir(name: str) -> str:
    return "" if name == _DEFAULT_TENANT else unquote(name)


def manifest_name(generation: int) -> str:
    return f"manifest-{generation:010d}.log"


def segment_name(seg_id: int) -> str:
    return f"seg-{seg_id:016x}"


def parse_manifest_name(name: str) -> int | None:
    m = _MANIFEST_RE.match(name)
    return int(m.group(1)) if m else None


def parse_segment_name(name: str) -> int | None:
    m = _SEGMENT_RE.match(name)
    return int(m.group(1), 16) if m else None


T = TypeVar("T")
_RACE_TRIES = 8
# What GlusterFS's replication answers, for a moment, to a client that lost a race to
# create a name: EIO, or ENOTCONN while it finds no replica it trusts for the new entry.
_RACE_ERRNOS = (errno.EIO, errno.ENOTCONN)


def make_shared_dir(path: Path, mode: int = 0o777) -> bool:
    """mkdir -p for a directory other hosts may be creating at the same moment; True
    if this call created ``path`` itself."""

    def attempt() -> bool:
        if path.is_dir():
            return False
        if not path.parent.is_dir():
            make_shared_dir(path.parent)
        try:
            path.mkdir(mode=mode)
        except FileExistsError:
            if path.is_dir():
                return False
            raise
        return True

    return retry_races(attempt)


def retry_races(fn: Callable[[], T]) -> T:
    """``fn()``, again after a short back-off while it fails as a lost creation race does.

    GlusterFS answers EIO or ENOTCONN, for a moment, to a client that looks up or
    creates a name another client is creating (its replicas are still agreeing on the
    new entry). About 2.5 s in all: a mount that is really gone still fails, just later.
    """
    for attempt in range(_RACE_TRIES):
        try:
            return fn()
        except OSError as e:
            if e.errno not in _RACE_ERRNOS or attempt == _RACE_TRIES - 1:
                raise
            time.sleep(0.02 * 2**attempt)
    raise AssertionError("unreachable")


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.daemons = self.root / "daemons"
        self.leases = self.root / "leases"
        self.tenants = self.root / "tenants"

    def ensure(self) -> None:
        """Create the top directories and the FORMAT marker; refuse a foreign root."""
        try:
            make_shared_dir(self.root)
            retry_races(lambda: self._publish_format(self.root / "FORMAT"))
            for d in (self.daemons, self.leases, self.tenants):
                make_shared_dir(d)
        except OSError as e:
            raise SharedFSConfigError(f"cannot set up shared-fs root {self.root}: {e}") from None

    def _publish_format(self, marker: Path) -> None:
        # Daemons on other hosts may start at the same moment and read the marker while it
        # is being created, so it must never be visible half-written: write it whole under
        # a private name, then link() it into place, which publishes it only if absent (an
        # O_EXCL create followed by a write let a peer read it empty and refuse the root).
        if not marker.exists():
            tmp = marker.with_name(f"FORMAT.{os.getpid()}-{secrets.token_hex(8)}.tmp")
            try:
                with open(tmp, "x") as f:
                    f.write(FORMAT_TEXT)
                    f.flush()
                    os.fsync(f.fileno())
                with contextlib.suppress(FileExistsError):  # a peer published it first
                    os.link(tmp, marker)
            finally:
                tmp.unlink(missing_ok=True)
        text = marker.read_text(errors="replace")
        if text != FORMAT_TEXT:
            raise SharedFSConfigError(
                f"{self.root} holds another format ({text.strip()!r}); "
                f"expected {FORMAT_TEXT.strip()!r}"
            )

    # -- per daemon -------------------------------------------------------------------
    def daemon_dir(self, daemon: str) -> Path:
        return self.daemons / daemon

    def lease_dir(self, daemon: str) -> Path:
        return self.leases / daemon

    # -- per namespace ----------------------------------------------------------------
    def tenant_dir(self, tenant: str) -> Path:
        return self.tenants / tenant_dir_name(tenant)

    def namespace_dir(self, tenant: str, fingerprint: bytes) -> Path:
        return self.tenant_dir(tenant) / fingerprint.hex()

    def owner_dir(self, tenant: str, fingerprint: bytes, daemon: str) -> Path:
        return self.namespace_dir(tenant, fingerprint) / daemon

    def segment_path(self, tenant: str, fingerprint: bytes, daemon: str, seg_id: int) -> Path:
        return self.owner_dir(tenant, fingerprint, daemon) / segment_name(seg_id)

    def ensure_owner_dir(self, tenant: str, fingerprint: bytes, daemon: str, mode: int) -> Path:
        tdir = self.tenant_dir(tenant)
        if make_shared_dir(tdir, mode):  # checks for the directory itself, races retried
            os.chmod(tdir, mode)  # mkdir's mode is filtered by the umask
        make_shared_dir(self.namespace_dir(tenant, fingerprint))
        d = self.owner_dir(tenant, fingerprint, daemon)
        d.mkdir(exist_ok=True)
        return d

    def owner_dirs_of(self, daemon: str) -> Iterator[tuple[str, bytes, Path]]:
        """Every namespace directory ``daemon`` has written: (tenant, fingerprint, dir)."""
        for tdir in _listdir(self.tenants):
            for fp_hex in _listdir(self.tenants / tdir):
                d = self.tenants / tdir / fp_hex / daemon
                if len(fp_hex) == 32 and d.is_dir():
                    yield tenant_of_dir(tdir), bytes.fromhex(fp_hex), d

    def owners_of(self, tenant: str, fingerprint: bytes) -> list[str]:
        """Daemons that hold files of this namespace (one directory listing)."""
        return sorted(_listdir(self.namespace_dir(tenant, fingerprint)))

    def daemons_known(self) -> list[str]:
        return sorted(_listdir(self.daemons))


def manifests_in(d: Path) -> list[int]:
    """Generations of the complete manifests in ``d`` (temporary files are skipped)."""
    out = [g for g in (parse_manifest_name(n) for n in _listdir(d)) if g is not None]
    return sorted(out)


def segments_in(d: Path) -> list[int]:
    return sorted(s for s in (parse_segment_name(n) for n in _listdir(d)) if s is not None)


def _listdir(d: Path) -> list[str]:
    try:
        return os.listdir(d)
    except (FileNotFoundError, NotADirectoryError):
        return []


def check_daemon_id(daemon: str) -> None:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", daemon):
        raise SharedFSConfigError(f"bad daemon id {daemon!r}")
