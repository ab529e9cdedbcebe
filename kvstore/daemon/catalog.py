"""The namespaces the daemon has known, by tenant, so a whole tenant can be deleted.

Tiers index blocks by namespace fingerprint, which does not reveal the tenant; deleting
a tenant therefore needs the namespaces it registered — including those registered
before a restart whose blocks still sit on SSD. With a persistent tier the catalogue is
kept in a file beside it (one line per change: ``+ <NamespaceSpec hex>`` or
``- <fingerprint hex>``, appended and fsync'd; a torn last line from a crash is skipped),
read back at start. ``MemoryCatalog`` is the case without one (a DRAM-only daemon loses
its blocks on restart anyway).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kvstore.errors import IntegrityError, InvalidArgument
from kvstore.keys import Namespace
from kvstore.wire.codec import ns_from_proto, ns_to_proto
from kvstore.wire.proto import kvstore_pb2 as pb

log = logging.getLogger(__name__)
FILE_NAME = "daemon-namespaces.log"


class MemoryCatalog:
    """Thread-safe. ``add`` is called on every register; only news is written down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_fp: dict[bytes, Namespace] = {}

    def add(self, ns: Namespace) -> None:
        with self._lock:
            if self._by_fp.get(ns.fingerprint) == ns:
                return
            self._by_fp[ns.fingerprint] = ns
            self._append(f"+ {ns_to_proto(ns).SerializeToString().hex()}")

    def of_tenant(self, tenant: str) -> list[Namespace]:
        return self.of_tenants(lambda t: t == tenant)

    def of_tenants(self, scope: Callable[[str], bool]) -> list[Namespace]:
        with self._lock:
            return [ns for ns in self._by_fp.values() if scope(ns.tenant)]

    def forget(self, namespaces: list[Namespace]) -> None:
        with self._lock:
            for ns in namespaces:
                if self._by_fp.pop(ns.fingerprint, None) is not None:
                    self._append(f"- {ns.fingerprint.hex()}")

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_fp)

    def _append(self, line: str) -> None:
        pass

    def close(self) -> None:
        pass

    def check_integrity(self) -> None:
        with self._lock:
            for fp, ns in self._by_fp.items():
                if ns.fingerprint != fp:
                    raise IntegrityError("catalogue entry filed under another fingerprint")


class FileCatalog(MemoryCatalog):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._replay()
        try:
            self._f = open(path, "a", encoding="ascii")  # noqa: SIM115 - open for the daemon's life
        except OSError as e:
            raise InvalidArgument(
                f"cannot write the namespace catalogue {path}: {e.strerror}"
            ) from None

    def _replay(self) -> None:
        try:
            lines = self.path.read_text(encoding="ascii", errors="replace").splitlines()
        except FileNotFoundError:
            return
        except OSError as e:
            raise InvalidArgument(
                f"cannot read the namespace catalogue {self.path}: {e.strerror}"
            ) from None
        for n, line in enumerate(lines, 1):
            op, _, arg = line.partition(" ")
            try:
                if op == "+":
                    ns = ns_from_proto(pb.NamespaceSpec.FromString(bytes.fromhex(arg)))
                    self._by_fp[ns.fingerprint] = ns
                elif op == "-":
                    self._by_fp.pop(bytes.fromhex(arg), None)
                else:
                    raise ValueError(f"unknown record {op!r}")
            except Exception as e:  # a torn line (crash while appending): skip it
                log.warning("%s:%d: skipping unreadable catalogue line (%s)", self.path, n, e)

    def _append(self, line: str) -> None:
        self._f.write(line + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def open_catalog(directory: str | None) -> MemoryCatalog:
    return FileCatalog(Path(directory) / FILE_NAME) if directory else MemoryCatalog()
