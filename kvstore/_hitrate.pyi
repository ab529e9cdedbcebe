"""Types of the native module built from kvstore/_hitrate*.c (see kvstore/hitrate/onepass.py
and kvstore/hitrate/s3replay.py)."""

from typing import Any

class Stack:
    def __init__(
        self,
        caps: Any,
        retention_s: float,
        time_scale: float,
        keep_tokens: float,
        rate: float,
        max_bytes: int,
    ) -> None: ...
    def feed(
        self, keys: Any, offsets: Any, times: Any, lengths: Any, block_tokens: int
    ) -> None: ...
    def totals(
        self,
    ) -> tuple[
        int,
        int,
        int,
        int,
        int,
        list[
            tuple[
                tuple[int, int, int],
                tuple[int, int, int],
                float,
                float,
                tuple[int, ...],
            ]
        ],
    ]: ...
    def check(self) -> None: ...
    @property
    def live_blocks(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...

def mix64(x: int, /) -> int: ...
def split_hash_ids(doc: bytes, /) -> tuple[bytes, bytes, bytes]: ...

class S3Fifo:
    def __init__(
        self, caps: Any, retention_s: float, time_scale: float, keep_tokens: int
    ) -> None: ...
    def feed(
        self, keys: Any, offsets: Any, times: Any, lengths: Any, block_tokens: int
    ) -> None: ...
    def totals(
        self,
    ) -> tuple[
        int,
        int,
        int,
        int,
        list[tuple[tuple[int, int, int], tuple[int, int, int], float, int]],
    ]: ...
    def check(self) -> None: ...
    @property
    def blocks(self) -> int: ...
    @property
    def memory_bytes(self) -> int: ...
