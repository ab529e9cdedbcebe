"""Request building and response reading shared by the sync and asyncio clients.

Everything here is transport-free: validation happens before any RPC (misuse raises
``ValueError`` with nothing sent), messages are plain protobufs, and ``GetReader``
turns a stream of ``GetResponse`` into verified payload rows of the caller's buffer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.block import make_header
from kvstore.buffers import block_view, rows_view
from kvstore.errors import BlockError, InvalidArgument
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult
from kvstore.wire import codec
from kvstore.wire.codec import MAX_PROMPT_TOKENS
from kvstore.wire.proto import kvstore_pb2 as pb


def check_ns(ns: Any) -> Namespace:
    if not isinstance(ns, Namespace):
        raise InvalidArgument(f"expected a Namespace, got {type(ns).__name__}")
    return ns


def check_prompt_tokens(n: Any) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_PROMPT_TOKENS:
        raise InvalidArgument(f"prompt_tokens must be an int in [0, 2**63), got {n!r}")
    return n


def dst_rows(ns: Namespace, keys: Sequence[Key], dst: Any) -> memoryview:
    return rows_view(dst, len(keys), ns.block_bytes, writable=True)


def payload_views(
    ns: Namespace, keys: Sequence[Key], payloads: Mapping[int, Any]
) -> dict[int, memoryview]:
    """Validated payload rows by chain index, in index order."""
    out: dict[int, memoryview] = {}
    for idx in sorted(
        payloads, key=lambda i: (not isinstance(i, int), i if isinstance(i, int) else 0)
    ):
        if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(keys):
            raise InvalidArgument(f"payload index {idx!r} outside the chain of {len(keys)} keys")
        out[idx] = block_view(payloads[idx], ns.block_bytes)
    return out


def commit_open(
    ns: Namespace,
    keys: Sequence[Key],
    indices: Sequence[int],
    durability: str,
) -> pb.CommitRequest:
    return pb.CommitRequest(
        open=pb.CommitOpen(
            ns=codec.ns_to_proto(ns),
            keys=keys,
            indices=indices,
            durability=codec.durability_to_proto(durability),
        )
    )


def commit_chunks(
    ns: Namespace, keys: Sequence[Key], views: Mapping[int, memoryview], durability: str
) -> Iterator[pb.CommitRequest]:
    """The gRPC-path Commit stream: open, then every block's chunks."""
    yield commit_open(ns, keys, list(views), durability)
    fp = ns.fingerprint
    for idx, row in views.items():
        for chunk in codec.iter_chunks(idx, fp, keys[idx], row):
            yield pb.CommitRequest(chunk=chunk)


def staged_commit(
    ns: Namespace,
    keys: Sequence[Key],
    views: Mapping[int, memoryview],
    durability: str,
    staging: pb.StagingRef,
) -> pb.CommitStagedRequest:
    """The fast-path commit: rows are already in the segment at ``staging``; the headers
    let the daemon verify each one's checksum."""
    fp = ns.fingerprint
    return pb.CommitStagedRequest(
        ns=codec.ns_to_proto(ns),
        keys=keys,
        indices=list(views),
        durability=codec.durability_to_proto(durability),
        staging=staging,
        headers=[make_header(fp, keys[i], row).pack() for i, row in views.items()],
    )


def commit_result(resp: pb.CommitResponse) -> CommitResult:
    return CommitResult(
        inserted=resp.inserted,
        present=resp.present,
        dropped=resp.dropped,
        durability=codec.durability_from_proto(resp.durability),  # type: ignore[arg-type]
    )


@dataclass
class GetReader:
    """Consumes a Get stream into ``rows``. ``hit`` is the verified prefix length: a
    block that fails verification ends the prefix there (a miss, counted)."""

    ns: Namespace
    keys: Sequence[Key]
    rows: memoryview
    corrupt_blocks: int = 0
    _done: int | None = None

    def __post_init__(self) -> None:
        self._asm = codec.BlockAssembler(
            self.ns, self.keys, self.rows, {i: i for i in range(len(self.keys))}
        )
        self._broken = False

    def feed(self, msg: pb.GetResponse) -> bool:
        """Take one message; False once the rest of the stream is useless."""
        if msg.WhichOneof("part") == "done":
            self._done = msg.done.hit_blocks
            return False
        if self._broken:
            return False
        try:
            self._asm.add(msg.chunk)
        except (BlockError, InvalidArgument):
            self.corrupt_blocks += 1
            self._broken = True
            return False
        return True

    @property
    def hit(self) -> int:
        n = self._asm.prefix_blocks
        return n if self._done is None else min(n, self._done)

    @property
    def checksums(self) -> list[int]:
        """The stored checksum of each verified block of the prefix, in order."""
        return self._asm.prefix_checksums(self.hit)
