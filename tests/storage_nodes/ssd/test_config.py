from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.errors import InvalidArgument
from storage_nodes.ssd import SSDConfig, SSDConfigError
from storage_nodes.ssd.config import slot_bytes_for
from storage_nodes.testing.crash import with_crash_hook


@pytest.mark.parametrize(
    "kw",
    [
        dict(capacity_bytes=0),
        dict(capacity_bytes=1 << 20, slab_bytes=4 << 20),
        dict(slab_bytes=5000),
        dict(queue_depth=0),
        dict(queue_depth=10_000),
        dict(retention_s=0),
        dict(sweep_interval_s=0),
        dict(direct_io="yes"),
        dict(capacity_bytes=True),
    ],
)
def test_bad_config_is_a_one_line_value_error(tmp_path: Path, kw: dict) -> None:
    args = dict(dir=tmp_path, capacity_bytes=1 << 30)
    args.update(kw)
    with pytest.raises(SSDConfigError) as e:
        SSDConfig(**args)
    assert isinstance(e.value, InvalidArgument) and "\n" not in str(e.value)


def test_defaults(tmp_path: Path) -> None:
    c = SSDConfig(dir=str(tmp_path), capacity_bytes=1 << 30)
    assert c.dir == tmp_path and c.retention_s == 72 * 3600 and c.queue_depth == 32
    assert c.slab_bytes == 128 << 20 and c.chunks == 8
    assert c.direct_io is None and c.io_backend == "auto"


def test_buckets(tmp_path: Path) -> None:
    c = SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, retention_s=3600)
    assert c.bucket_of(59.9) == 0 and c.bucket_of(60) == 1
    assert c.expiry_bucket(7200) == 60


def test_slot_size() -> None:
    assert slot_bytes_for(2048) == 4096
    assert slot_bytes_for(4096 - 64) == 4096
    assert slot_bytes_for(4096) == 8192
    assert slot_bytes_for(256 << 10) == (256 << 10) + 4096


def test_auto_slab_size(tmp_path: Path) -> None:
    assert SSDConfig(dir=tmp_path, capacity_bytes=1 << 40).slab_bytes == 256 << 20
    assert SSDConfig(dir=tmp_path, capacity_bytes=800 << 20).slab_bytes == 100 << 20
    assert SSDConfig(dir=tmp_path, capacity_bytes=4 << 20).slab_bytes == 4 << 20
    assert SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, slab_bytes=1 << 20).slab_bytes == 1 << 20


def test_directory_keeps_its_slab_size(tmp_path: Path) -> None:
    from storage_nodes.ssd import SSDFormatError, SSDTier

    SSDTier(SSDConfig(dir=tmp_path, capacity_bytes=64 << 20, sweep_interval_s=None)).close()
    t = SSDTier(SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, sweep_interval_s=None))
    assert t.config.slab_bytes == 8 << 20 and t.config.chunks == 128  # kept, not 128 MiB
    t.close()
    with pytest.raises(SSDFormatError, match="slab_bytes"):
        SSDTier(SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, slab_bytes=1 << 20))
    SSDTier(SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, sweep_interval_s=None)).close()


def test_crash_points_are_a_test_seam_not_configuration(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, crash_hook=print)  # type: ignore[call-arg]
    reached: list[str] = []
    c = with_crash_hook(SSDConfig(dir=tmp_path, capacity_bytes=1 << 30), reached.append)
    SSDConfig(dir=tmp_path, capacity_bytes=1 << 30).crash_point("after_free")  # a no-op
    # An existing directory's slab size replaces the config; the hook must come along.
    adopted = c.with_slab_bytes(8 << 20)
    adopted.crash_point("after_free")
    assert (adopted.slab_bytes, reached) == (8 << 20, ["after_free"])
