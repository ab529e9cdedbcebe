"""Whether memory lies on transparent huge pages, read from ``/proc/self/smaps``: the
SSD tier's I/O buffers must (``kvstore.buffers.io_buffer``), and tests check it where
the kernel offers huge pages at all."""

from __future__ import annotations


def huge_kib(address: int, nbytes: int) -> int:
    """AnonHugePages of the mappings of this process that overlap [address, +nbytes)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < address + nbytes and address < hi
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    return total


def thp_advised() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False
