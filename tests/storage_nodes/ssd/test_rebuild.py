"""Index rebuilt from the slot headers (``rebuild.py``): when it happens (a dirty fast
index from another boot, an index LMDB cannot read) and when not (clean close, process
crash in the same boot, strict mode), and what it brings back: every live block, at
its class's offsets, newest copy of a key, never a deleted namespace or an expired block."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from storage_nodes.ssd import SSDTier
from storage_nodes.testing.crash import abandon
from tests.storage_nodes.ssd.helpers import (
    SLAB,
    FakeClock,
    chain,
    make_config,
    rows,
    small_ns,
    verify_all,
)


def _open(d: Path, boot: str, **kw) -> SSDTier:  # type: ignore[no-untyped-def]
    t = SSDTier(make_config(d, boot_id=boot.strip, **kw))
    t.register(small_ns())
    return t


def test_when_the_index_is_rebuilt(tmp_path: Path) -> None:
    ns = small_ns()
    d = tmp_path / "ssd"
    t = _open(d, "1")
    k = chain(ns, 20)
    t.put(ns, k, rows(ns, k))
    t.close()
    t = _open(d, "2")  # clean close: trusted, even after a reboot
    assert t.rebuild_report is None and verify_all(t, ns) == 20
    abandon(t)
    t = _open(d, "2")  # process crash, same boot: trusted
    assert t.rebuild_report is None and verify_all(t, ns) == 20
    abandon(t)
    t = _open(d, "3")  # unclean, another boot: rebuilt
    r = t.rebuild_report
    assert r is not None and r.blocks == 20 and r.slabs == 1
    assert verify_all(t, ns) == 20 and t.stats().counters["corrupt_blocks_total"] == 0
    t.check_integrity()
    t.close()


def test_strict_mode_never_rebuilds_after_a_reboot(tmp_path: Path) -> None:
    ns = small_ns()
    d = tmp_path / "ssd"
    t = _open(d, "1", index_durability="strict")
    k = chain(ns, 5)
    t.put(ns, k, rows(ns, k))
    abandon(t)
    t = _open(d, "2", index_durability="strict")
    assert t.rebuild_report is None and verify_all(t, ns) == 5
    assert t.stats().info["index_durability"] == "strict"
    abandon(t)
    t = _open(d, "3")  # the last writer was strict: its synced index is trusted
    assert t.rebuild_report is None
    t.close()


def test_unreadable_index_is_rebuilt(tmp_path: Path) -> None:
    """MDB_INVALID/MDB_CORRUPTED at open, even after a clean close: rebuilt."""
    ns = small_ns()
    d = tmp_path / "ssd"
    t = _open(d, "1")
    k = chain(ns, 12)
    t.put(ns, k, rows(ns, k))
    t.close()
    data = d / "index" / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[: 2 * 4096] = b"\xa5" * (2 * 4096)  # both meta pages
    data.write_bytes(bytes(raw))
    t = _open(d, "1")
    assert t.rebuild_report is not None and t.rebuild_report.blocks == 12
    assert verify_all(t, ns) == 12
    t.check_integrity()
    t.close()


def test_deleted_namespace_stays_deleted(tmp_path: Path) -> None:
    clock = FakeClock()
    ns, other = small_ns(), small_ns(model_id="other")
    d = tmp_path / "ssd"
    t = _open(d, "1", clock=clock)
    t.register(other)
    k, o = chain(ns, 10, salt=1), chain(other, 4, salt=2)
    t.put(ns, k, rows(ns, k))
    t.put(other, o, rows(other, o))
    assert t.delete_namespace(ns) == 10
    clock.advance(5)
    again = chain(ns, 3, salt=3)  # written after the delete: must come back
    t.put(ns, again, rows(ns, again))
    abandon(t)
    t = _open(d, "2", clock=clock)
    t.register(other)
    assert t.rebuild_report is not None
    assert set(t.iter_keys(ns)) == set(again)
    assert verify_all(t, ns) == 3 and verify_all(t, other) == 4
    t.close()


def test_expired_blocks_are_left_out(tmp_path: Path) -> None:
    clock = FakeClock()
    ns = small_ns()
    d = tmp_path / "ssd"
    t = _open(d, "1", clock=clock, retention_s=3600.0)
    old = chain(ns, 6, salt=1)
    t.put(ns, old, rows(ns, old))
    clock.advance(3000)
    new = chain(ns, 4, salt=2)
    t.put(ns, new, rows(ns, new))
    abandon(t)
    clock.advance(1000)  # old is 4000 s old: idle past retention
    t = _open(d, "2", clock=clock, retention_s=3600.0)
    assert set(t.iter_keys(ns)) == set(new)
    t.check_integrity()
    t.close()


def test_newest_copy_of_a_key_wins(tmp_path: Path) -> None:
    clock = FakeClock()
    ns = small_ns()
    d = tmp_path / "ssd"
    t = _open(d, "1", clock=clock, retention_s=100.0)
    k = chain(ns, 4)
    t.put(ns, k, rows(ns, k))
    clock.advance(200)  # expired: the next put writes new copies into other slots
    assert t.put(ns, k, rows(ns, k)).inserted == 4
    abandon(t)
    newest: dict[bytes, tuple[int, int]] = {}  # key -> (created, slot), over both copies
    copies = 0
    raw = (d / "slabs" / "slab-00000").read_bytes()
    for off in range(0, len(raw), 4096):
        key = raw[off + 24 : off + 40]
        if raw[off : off + 4] == b"KVB1" and key in k:
            copies += 1
            created = struct.unpack_from("<Q", raw, off + 56)[0]
            newest[key] = max(newest.get(key, (0, 0)), (created, off // 4096))
    assert copies == 8
    # a longer retention now: the older copies are not expired, the rebuild must choose
    t = _open(d, "2", clock=clock, retention_s=1000.0)
    assert t.rebuild_report is not None and t.rebuild_report.blocks == 4
    with t._index.begin() as txn:
        got = {key: t._index.get(txn, ns.fingerprint + key) for key in k}
    assert {key: loc.slot for key, loc in got.items() if loc} == {
        key: slot for key, (_, slot) in newest.items()
    }
    assert verify_all(t, ns) == 4
    t.check_integrity()
    t.close()


def test_handed_over_slab_is_read_at_its_new_class(tmp_path: Path) -> None:
    """A slab handed to another class still holds the old class's headers; the durable
    slab table makes the rebuild read it at the new class's offsets only."""
    small, big = small_ns(), small_ns(model_id="big", head_dim=64)
    d = tmp_path / "ssd"
    t = _open(d, "1", capacity_bytes=2 * SLAB)
    t.register(big)
    a, b = chain(small, 64, salt=1), chain(small, 64, salt=2)
    t.put(small, a, rows(small, a))
    t.put(small, b, rows(small, b))
    kb = chain(big, 3)
    assert t.put(big, kb, rows(big, kb)).inserted == 3
    assert t.stats().counters["slab_handovers"] == 1
    abandon(t)
    t = _open(d, "2", capacity_bytes=2 * SLAB)
    t.register(big)
    assert t.rebuild_report is not None
    assert set(t.iter_keys(big)) == set(kb) and set(t.iter_keys(small)) == set(b)
    assert verify_all(t, big) == 3 and verify_all(t, small) == 64
    assert t.stats().counters["corrupt_blocks_total"] == 0
    t.check_integrity()
    t.close()


def test_rebuild_without_a_slab_table_is_refused(tmp_path: Path) -> None:
    from storage_nodes.ssd import SSDFormatError

    ns = small_ns()
    d = tmp_path / "ssd"
    t = _open(d, "1")
    k = chain(ns, 3)
    t.put(ns, k, rows(ns, k))
    abandon(t)
    (d / "slabs" / "TABLE").unlink()
    with pytest.raises(SSDFormatError, match="no slab table"):
        _open(d, "2")
