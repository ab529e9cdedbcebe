"""A KV-events subscriber written against vLLM's published schema
(``vllm/distributed/kv_events.py``: ``EventBatch``/``KVEventBatch``, ``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``), decoding as vLLM's own subscriber does: a msgspec
msgpack decoder typed by the batch, so a missing required field, a wrong type or an unknown
tag fails the decode. Required fields have no default here, as there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec
import zmq

ExternalBlockHash = bytes | int


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple | None] | None = None  # type: ignore[type-arg]
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
END_SEQ = -1


@dataclass
class Received:
    seq: int
    batch: KVEventBatch
    payload: bytes


class Subscriber:
    """SUB on a publisher's endpoint (every topic); ``replay`` asks its ROUTER socket."""

    def __init__(self, endpoint: str, replay_endpoint: str | None = None) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint

    def recv(self, timeout_s: float) -> Received | None:
        if not self.sub.poll(int(timeout_s * 1000)):
            return None
        _topic, seq, payload = self.sub.recv_multipart()
        return Received(int.from_bytes(seq, "big"), DECODER.decode(payload), payload)

    def recv_until(self, done: object, timeout_s: float = 20.0) -> list[Received]:
        """Batches until ``done(all_received)`` holds; fails on timeout."""
        got: list[Received] = []
        deadline = time.monotonic() + timeout_s
        while not done(got):  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; received {[r.batch for r in got]}")
            r = self.recv(0.2)
            if r is not None:
                got.append(r)
        return got

    def replay(self, start_seq: int, timeout_s: float = 10.0) -> list[Received]:
        """The batches the publisher still buffers from ``start_seq`` on (vLLM's
        protocol: a REQ-framed request of 8 big-endian bytes, replies until seq -1)."""
        assert self.replay_endpoint is not None
        req = self.ctx.socket(zmq.DEALER)
        req.connect(self.replay_endpoint)
        try:
            req.send_multipart((b"", start_seq.to_bytes(8, "big")))
            out: list[Received] = []
            while True:
                if not req.poll(int(timeout_s * 1000)):
                    raise AssertionError("replay: no end marker")
                _empty, _topic, seq_b, payload = req.recv_multipart()
                seq = int.from_bytes(seq_b, "big", signed=True)
                if seq == END_SEQ:
                    return out
                out.append(Received(seq, DECODER.decode(payload), payload))
        finally:
            req.close(linger=0)

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def events(received: list[Received]) -> list[KVCacheEvent]:
    return [e for r in received for e in r.batch.events]
