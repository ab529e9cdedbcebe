"""The kvstore error hierarchy.

DESIGN §5: misses are return values, never exceptions. Misuse raises ``ValueError``
(every misuse error below is also a ``ValueError``), a broken invariant raises
``IntegrityError``, and an unreachable store raises ``StoreUnavailable``, which callers
treat as a miss.
"""

from __future__ import annotations


class KVStoreError(Exception):
    """Base of every error raised by the kvstore package."""


class InvalidArgument(KVStoreError, ValueError):
    """The caller passed something the API does not accept (a misuse, not a miss)."""


class InvalidTokens(InvalidArgument):
    """Token ids that are not integers in [0, 2**32)."""


class UnknownNamespace(InvalidArgument):
    """A namespace was used before ``register`` (or after it was deleted)."""


class BufferSizeError(InvalidArgument):
    """A source or destination buffer whose size is not ``n × block_bytes``."""


class IntegrityError(KVStoreError):
    """An internal invariant does not hold; raised by ``check_integrity()``."""


class StoreUnavailable(KVStoreError):
    """The store cannot be reached in time; callers treat it as a miss."""


class NotDurable(KVStoreError):
    """``flush()``: blocks accepted before the call were refused by the tier below DRAM
    (it failed, is read-only or degraded); they are held in DRAM only. Neither a misuse
    nor an unreachable store: the store works, it could not keep this promise.

    ``refused_blocks`` says how many (counted once: a later ``flush`` reports only blocks
    refused after this one was raised)."""

    def __init__(self, refused_blocks: int, detail: str = "") -> None:
        self.refused_blocks = refused_blocks
        self.detail = detail
        why = f": {detail}" if detail else ""
        super().__init__(f"{refused_blocks} accepted blocks were not made durable{why}")

    @classmethod
    def from_message(cls, message: str) -> NotDurable:
        """Rebuild from ``str(err)`` (how the error crosses gRPC)."""
        head, _, rest = message.partition(" accepted blocks were not made durable")
        try:
            n = int(head.strip())
        except ValueError:
            return cls(0, message)
        return cls(n, rest.removeprefix(": "))

    def __reduce__(self) -> tuple[type[NotDurable], tuple[int, str]]:
        return NotDurable, (self.refused_blocks, self.detail)


class BlockError(KVStoreError):
    """An encoded block failed validation (DESIGN §4). Readers turn it into a miss."""


class BlockTruncatedError(BlockError):
    """Fewer bytes than a header, or than the header's payload length."""


class BlockMagicError(BlockError):
    """The first four bytes are not ``b"KVB1"``."""


class BlockVersionError(BlockError):
    """A format version this reader does not understand."""


class BlockFingerprintError(BlockError):
    """The block belongs to another namespace."""


class BlockKeyError(BlockError):
    """The block is stored under another key (a misdirected write or a stale slot)."""


class BlockLengthError(BlockError):
    """The payload length is not the namespace's ``block_bytes``."""


class BlockChecksumError(BlockError):
    """The payload does not match its xxh3-64 checksum."""
