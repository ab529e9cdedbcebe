"""``--kv-store`` openers: an embedded store sized past the machine is one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import EngineInputError
from engine.kv.stores import StoreOptions, open_store_link


def test_more_dram_than_the_machine_has_is_refused_before_the_store_opens(
    tmp_path: Path,
) -> None:
    # Issue 36 (item 1): kvengine's embedded store, like kvstore serve/demo/loadgen, got
    # numpy's _ArrayMemoryError traceback; now the shared check of kvstore.host.
    where = tmp_path / "store"
    with pytest.raises(EngineInputError, match=r"--dram 1024\.0 TiB is more than this machine"):
        open_store_link(
            f"embedded:{where}", lambda tenant: pytest.fail("no namespace"),
            StoreOptions(dram_bytes=1 << 50),
        )
    assert not where.exists()
