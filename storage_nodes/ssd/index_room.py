"""The index file kept allocated ahead of LMDB's last page (fast index mode).

In the fast mode the index is opened with LMDB's ``writemap``: a transaction writes its
pages straight into the shared mapping, and its commit writes no pages (a put's
publishing commit, ~80 µs of a ~2.3 ms put of 32 blocks with the device idle, became a
meta-page update; one caller's puts +5–8 %, ``bench/RESULTS.md``). The price is how a full file
system shows: LMDB makes the data file a sparse file of the whole map, and a store into
a page the file system cannot back is a SIGBUS that kills the process, where a
``pwrite`` would have returned ENOSPC.

So no page LMDB may write is ever a hole. Before each write transaction begins, the file
is allocated (``posix_fallocate``) past LMDB's last page by twice what is in use plus the
transaction's announced growth: a transaction can dirty at most the pages that exist
(copy-on-write gives each a new page) plus those of the records it adds, and LMDB reuses
freed pages before it extends the file. Where the file system cannot give that room, the
transaction is refused with ENOSPC as the tier's I/O error (it degrades to read-only and
probes its way back, as after any failed write) — before anything is written.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import lmdb

from storage_nodes.ssd.errors import SSDIOError

#: allocated beyond the room a transaction needs, so the file grows in steps
_STEP_BYTES = 1 << 20
#: bytes a new record may take in the B-trees it enters (leaf entry, half-full pages,
#: branch pages): what ``ensure`` is told per record a large transaction adds
RECORD_BYTES = 256


class MapRoom:
    """Keeps ``data.mdb`` under ``path`` allocated ahead of ``env``'s last page.

    Contract: ``ensure(extra)`` returns once every page the next write transaction can
    touch — twice the pages in use plus ``extra`` bytes of new records — is allocated
    on disk, or raises ``SSDIOError`` (ENOSPC, EDQUOT, ...) having allocated nothing
    LMDB relies on; ``allocated`` never shrinks while the file is open."""

    def __init__(self, env: lmdb.Environment, path: Path) -> None:
        self._env = env
        self._psize = int(env.stat()["psize"])
        self._fd = os.open(path / "data.mdb", os.O_RDWR | os.O_CLOEXEC)
        self.allocated = 0

    def ensure(self, extra_bytes: int = 0) -> None:
        used = (int(self._env.info()["last_pgno"]) + 1) * self._psize
        need = 2 * used + extra_bytes + _STEP_BYTES
        if need <= self.allocated:
            return
        target = -(-(need + need // 4) // _STEP_BYTES) * _STEP_BYTES
        try:
            os.posix_fallocate(self._fd, 0, target)
        except OSError as e:
            raise SSDIOError(
                f"the SSD index file cannot grow to {target} bytes: {e.strerror}",
                e.errno or errno.ENOSPC,
            ) from e
        self.allocated = target

    def close(self) -> None:
        os.close(self._fd)
