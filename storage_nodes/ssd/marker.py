"""The shutdown marker ``DIR/STATE``: was the index closed cleanly, and if not, did the
machine restart since (DESIGN §6, crash safety).

In the default (``fast``) durability mode the index is written without a sync per
commit, so only two situations let an open trust it: a clean close (the index was synced
and the marker says ``clean``), or a crash of the process alone — same ``boot_id``, so
every committed write is still in the page cache, and LMDB, which never overwrites a
page a committed transaction still names, is consistent. After a power cut or an OS
crash (another ``boot_id``) the unsynced index may have lost writes in any order: it is
rebuilt from the slot headers. In ``strict`` mode every commit is synced, and the
marker only records which mode last wrote the directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from storage_nodes.ssd.slab_table import write_durably

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id() -> str:
    """This boot's id (changes at every reboot); a constant where /proc lacks it, which
    makes every unclean shutdown look like a process crash there."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return "unknown-boot"


@dataclass(frozen=True, slots=True)
class MarkerState:
    clean: bool
    boot_id: str = ""
    mode: str = ""

    @property
    def present(self) -> bool:
        return self.clean or bool(self.boot_id)


class ShutdownMarker:
    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "STATE"

    def read(self) -> MarkerState:
        try:
            words = self.path.read_text().split()
        except FileNotFoundError:
            return MarkerState(clean=False)
        if words[:1] == ["clean"]:
            return MarkerState(clean=True)
        if len(words) == 3 and words[0] == "dirty":
            return MarkerState(clean=False, boot_id=words[1], mode=words[2])
        return MarkerState(clean=False, boot_id="?", mode="fast")  # unreadable: distrust

    def mark_dirty(self, boot_id: str, mode: str) -> None:
        """Durable before the first index write of this open."""
        write_durably(self.path, f"dirty {boot_id} {mode}\n".encode())

    def mark_clean(self) -> None:
        """Only after the index itself was synced."""
        write_durably(self.path, b"clean\n")

    def needs_rebuild(self, state: MarkerState, boot_id: str, index_exists: bool) -> bool:
        """An index written without syncs that a reboot may have cut short."""
        if not index_exists or state.clean or not state.present:
            return False  # fresh, clean, or a directory from before the marker existed
        return state.mode != "strict" and state.boot_id != boot_id
