"""Types of the native module built from kvstore/_rowcopy.c (see kvstore/row_copy.py)."""

from collections.abc import Callable, Sequence

class Copier:
    def __init__(
        self,
        xxhash_library: str,
        error: type[Exception],
        threads: int = 2,
        chunk_bytes: int = ...,
        unit_bytes: int = ...,
        share_min_bytes: int = ...,
        spin_us: int = ...,
        split_rows: bool = ...,
    ) -> None: ...
    def copy_verified(
        self,
        src: memoryview,
        offsets: Sequence[int],
        dst: memoryview,
        row_bytes: int,
        sums: Sequence[int],
        during: Callable[[], object] | None = None,
    ) -> int: ...
    def copy_found(
        self,
        src: memoryview,
        index: tuple[dict[bytes, bytes], dict[bytes, int], dict[bytes, int], int, int],
        keys: Sequence[bytes],
        fingerprint: bytes,
        dst: memoryview | tuple[int, int, object],  # or (address, nbytes, owner)
        row_bytes: int,
        during: Callable[[int], object] | None = None,
    ) -> tuple[int, int]: ...
    def close(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
