"""The LMDB index on its own: records, scans, and check() catching each kind of damage."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.errors import IntegrityError
from storage_nodes.ssd import SSDFormatError
from storage_nodes.ssd.index import _FREE, _LRU, _SLOT, Index, Location
from storage_nodes.ssd.index_check import check_index

SLAB = 64 << 10  # 16 slots of 4 KiB
BB = 2048


def _fk(i: int) -> bytes:
    return bytes([1] * 16) + i.to_bytes(16, "big")


@pytest.fixture
def index(tmp_path: Path):
    ix = Index(tmp_path / "ix", map_bytes=64 << 20, slab_bytes=SLAB)
    with ix.write() as txn:
        ix.create_slab(txn, 0, BB, 16)
        for i in range(5):
            ix.insert(txn, _fk(i), Location(0, i, 10 + i, i + 1, i + 1))
        ix.set_seq_high_water(txn, 5)
    yield ix
    ix.close()


def _check(ix: Index) -> None:
    with ix.begin() as txn:
        check_index(ix, txn, chunks=4, slab_bytes=SLAB)


def test_records_and_scans(index: Index) -> None:
    _check(index)
    with index.write() as txn:
        assert index.get(txn, _fk(2)) == Location(0, 2, 12, 3, 3)
        assert list(index.iter_lru(txn))[:2] == [_fk(0), _fk(1)]
        assert list(index.iter_lru(txn, below_bucket=12)) == [_fk(0), _fk(1)]
        index.retouch(txn, _fk(0), index.get(txn, _fk(0)), 20, 6)
        index.set_seq_high_water(txn, 6)
        assert list(index.iter_lru(txn))[-1] == _fk(0)
        assert len(list(index.iter_free(txn, BB))) == 11
        assert sorted(index.iter_slab(txn, 0)) == sorted(_fk(i) for i in range(5))
        assert len(list(index.iter_namespace(txn, bytes([1] * 16)))) == 5
        index.remove(txn, _fk(1), index.get(txn, _fk(1)))
        index.remove(txn, _fk(2), index.get(txn, _fk(2)), reason=b"BlockChecksumError")
    _check(index)
    with index.begin() as txn:
        assert index.count(txn) == 3
        assert (0, 1) in set(index.iter_free(txn, BB)) and (0, 2) not in set(
            index.iter_free(txn, BB)
        )


def test_insert_into_a_used_slot_is_refused(index: Index) -> None:
    with pytest.raises(IntegrityError), index.write() as txn:
        index.insert(txn, _fk(9), Location(0, 3, 1, 9, 9))


@pytest.mark.parametrize(
    "damage", ["slot_map", "lru", "free_and_used", "used_count", "seq", "bad_slab"]
)
def test_check_catches_damage(index: Index, damage: str) -> None:
    with index.write() as txn:
        if damage == "slot_map":
            txn.delete(_SLOT.pack(0, 3), db=index.slots)
        elif damage == "lru":
            txn.delete(_LRU.pack(13, 4) + _fk(3), db=index.lru)
        elif damage == "free_and_used":
            txn.put(_FREE.pack(BB, 0, 4), b"", db=index.free)
        elif damage == "used_count":
            index._add_used(txn, 0, +1)
        elif damage == "seq":
            index.set_seq_high_water(txn, 2)
        elif damage == "bad_slab":
            index.create_slab(txn, 9, BB, 16)
    with pytest.raises(IntegrityError):
        _check(index)


def test_slab_size_is_fixed_at_creation(tmp_path: Path) -> None:
    Index(tmp_path / "ix", map_bytes=64 << 20, slab_bytes=SLAB).close()
    with pytest.raises(SSDFormatError, match="slab_bytes"):
        Index(tmp_path / "ix", map_bytes=64 << 20, slab_bytes=2 * SLAB)


def _allocated(ix_dir: Path) -> int:
    return (ix_dir / "data.mdb").stat().st_blocks * 512


def _used(ix: Index) -> int:
    return (ix.env.info()["last_pgno"] + 1) * ix.env.stat()["psize"]


def test_the_fast_index_file_is_allocated_ahead_of_what_lmdb_uses(tmp_path: Path) -> None:
    """Written in place (``writemap``), the file has no hole LMDB could store into: a
    store into one is a SIGBUS on a full disk (``index_room.py``)."""
    d = tmp_path / "ix"
    ix = Index(d, map_bytes=64 << 20, slab_bytes=SLAB)
    try:
        assert ix.env.flags()["writemap"] and ix.room is not None
        assert _allocated(d) >= 2 * _used(ix) + (1 << 20)  # sparse to 64 MiB otherwise
        with ix.write() as txn:
            for s in range(4):
                ix.create_slab(txn, s, BB, 16)
        with ix.write(8 << 20) as txn:  # a large one announced: room for it first
            assert _allocated(d) >= 2 * _used(ix) + (9 << 20)
            ix.set_seq_high_water(txn, 1)
        _check(ix)
    finally:
        ix.close()


def test_the_strict_index_is_not_written_in_place(tmp_path: Path) -> None:
    """Strict mode syncs every commit; in place that would be an ``msync`` of the map."""
    ix = Index(tmp_path / "ix", map_bytes=64 << 20, slab_bytes=SLAB, strict=True)
    try:
        assert not ix.env.flags()["writemap"] and ix.room is None
        with ix.write() as txn:
            ix.create_slab(txn, 0, BB, 16)
        _check(ix)
    finally:
        ix.close()
