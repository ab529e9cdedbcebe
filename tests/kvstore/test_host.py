"""``kvstore.host``: the one memory check of every command that sizes a store in-process."""

from __future__ import annotations

import pytest

from kvstore.errors import InvalidArgument
from kvstore.host import check_memory, memory_bytes, memory_size


def test_a_size_the_machine_can_back_passes() -> None:
    assert memory_size("--dram", "1MiB") == 1 << 20
    check_memory("--dram", 0)


def test_more_than_the_machine_is_refused_naming_the_flag() -> None:
    total = memory_bytes()
    assert total is not None  # Linux: sysconf knows
    with pytest.raises(InvalidArgument, match=r"^--dram 1024\.0 TiB is more than this machine"):
        memory_size("--dram", "1PiB")
    with pytest.raises(InvalidArgument, match=r"^--x "):
        check_memory("--x", total + 1)
