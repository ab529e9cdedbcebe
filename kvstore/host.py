"""What this machine can back: the one memory check of every command that sizes a store
in this process (``kvstore serve``, ``demo``, ``loadgen --store embedded``, ``kvengine``'s
embedded store). Without it a size past the machine's memory ends in numpy's
``_ArrayMemoryError`` traceback; with it, one line naming the flag (exit 2).

No gRPC or numpy here: the check runs before anything heavy is imported or allocated.
"""

from __future__ import annotations

import os

from kvstore.errors import InvalidArgument
from kvstore.units import format_bytes, parse_size


def memory_bytes() -> int | None:
    """This machine's physical memory, or ``None`` where it cannot be known."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def check_memory(flag: str, nbytes: int) -> None:
    """Refuse a memory size the machine cannot back at all."""
    total = memory_bytes()
    if total is not None and nbytes > total:  # not knowable: let the allocation decide
        raise InvalidArgument(
            f"{flag} {format_bytes(nbytes)} is more than this machine's memory "
            f"({format_bytes(total)})"
        )


def memory_size(flag: str, text: str | int) -> int:
    """A size given by ``flag`` for memory this process allocates: parsed and checked."""
    nbytes = parse_size(text)
    check_memory(flag, nbytes)
    return nbytes
