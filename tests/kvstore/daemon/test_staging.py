"""The daemon's shared-memory staging area."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clients.shm import map_segment
from kvstore.daemon.staging import DATA_OFFSET, StagingArea, StagingConfig
from kvstore.errors import InvalidArgument
from kvstore.wire.proto import kvstore_pb2 as pb


@pytest.fixture
def area(tmp_path: Path):  # type: ignore[no-untyped-def]
    a = StagingArea(
        StagingConfig(dir=str(tmp_path), max_segment_bytes=1 << 20, max_total_bytes=3 << 20)
    )
    yield a
    a.close()


def offer(seg) -> pb.OpenStagingResponse:  # type: ignore[no-untyped-def]
    return pb.OpenStagingResponse(
        staging_id=seg.id,
        path=seg.path,
        size_bytes=seg.size_bytes,
        data_offset=DATA_OFFSET,
        nonce=seg.nonce,
    )


def test_segment_is_shared_bounded_and_owned(area: StagingArea, tmp_path: Path) -> None:
    seg = area.open("alice", 100_000)
    assert oct(os.stat(seg.path).st_mode & 0o777) == "0o600"
    client = map_segment(offer(seg))
    assert client is not None
    client.rows(10, 5)[:] = b"hello"
    assert bytes(area.rows("alice", seg.id, 10, 5)) == b"hello"  # same memory
    assert not os.path.exists(seg.path)  # first use unlinked it; the mappings live on
    with pytest.raises(InvalidArgument):
        area.rows("bob", seg.id, 0, 5)
    with pytest.raises(InvalidArgument):
        area.rows("alice", seg.id, seg.size_bytes - DATA_OFFSET - 4, 5)
    with pytest.raises(InvalidArgument):
        area.rows("alice", seg.id, -1, 5)
    area.check_integrity()
    with pytest.raises(InvalidArgument):
        area.open("alice", 2 << 20)  # above the per-segment bound
    area.open("alice", 1 << 20)
    area.open("alice", 1 << 20)
    with pytest.raises(InvalidArgument):
        area.open("alice", 1 << 20)  # above the total bound
    client.close()
    area.close_segment("alice", seg.id)
    with pytest.raises(InvalidArgument):
        area.rows("alice", seg.id, 0, 1)


def test_wrong_nonce_or_path_means_no_fast_path(area: StagingArea) -> None:
    seg = area.open(None, 4096)
    assert (
        map_segment(
            pb.OpenStagingResponse(
                staging_id=seg.id,
                path=seg.path,
                size_bytes=seg.size_bytes,
                data_offset=DATA_OFFSET,
                nonce=b"\0" * 16,
            )
        )
        is None
    )
    assert (
        map_segment(
            pb.OpenStagingResponse(
                staging_id=seg.id,
                path="/nonexistent/x",
                size_bytes=1,
                data_offset=DATA_OFFSET,
                nonce=seg.nonce,
            )
        )
        is None
    )
    area.close()
    assert not os.path.exists(seg.path)
