"""``kvengine serve --kv-events-endpoint``: the pool's index changes published in vLLM's
KV-events wire format, so a router that scores replicas by their cached blocks (vllm-router's
``kv_aware`` policy, with ``--kv-event-source``) sees this replica's pool.

The format (vLLM's ``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``): a ZMQ PUB socket
sends each batch as three frames ``(topic, seq, payload)``, ``seq`` an 8-byte big-endian
counter from 0 and ``payload`` a msgpack array ``[ts, events, data_parallel_rank]``. Each event
is a msgpack map tagged by ``"type"``: ``BlockStored`` (``block_hashes``,
``parent_block_hash``, ``token_ids``, ``block_size``, ``lora_id``, ``medium``,
``lora_name``), ``BlockRemoved`` (``block_hashes``, ``medium``) or ``AllBlocksCleared``. A
ROUTER socket (the replay endpoint) answers a request ``(identity, b"", start_seq)`` with every
buffered batch from ``start_seq`` on, as ``(identity, b"", topic, seq, payload)``, then an end
marker ``(identity, b"", b"", -1, b"")``: a subscriber that sees a gap in ``seq`` asks for it.

Hashes are the pool's chain keys (bytes, DESIGN §3): routers only use them to chain a block to
its parent and to find what a removal names; they match prompts on ``token_ids``. One event per
block: the engine thread queues it and returns, a publisher thread batches whatever is queued.
Both endpoints are bound here (a router connects to them), port 0 picks a free port.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from engine.errors import EngineInputError
from engine.kv.kv_events import KVEventListener
from kvstore.keys import Key

log = logging.getLogger("engine.server.kv_events")

MEDIUM_GPU = "GPU"  # vLLM's name for the tier a pool is (kv_aware scores it first)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True)
class KvEventsConfig:
    endpoint: str  # tcp://HOST:PORT the PUB socket binds
    replay_endpoint: str | None  # tcp://HOST:PORT the replay ROUTER socket binds
    block_tokens: int  # BlockStored.block_size: the pool's block size
    topic: str = ""  # vLLM's default: subscribers filter on a prefix of it
    replay_buffer_batches: int = 10_000  # as vLLM's buffer_steps
    hwm_messages: int = 100_000  # PUB high-water mark
    max_events_per_batch: int = 4096


class KvEventPublisher(KVEventListener):
    """A pool listener (registered with ``KVManager.events``) that publishes; ``close``
    stops it (idempotent). ``endpoint`` and ``replay_endpoint`` are the bound addresses
    (None when it publishes nothing)."""

    endpoint: str | None = None
    replay_endpoint: str | None = None

    def close(self) -> None:
        return None


class NullKvEventPublisher(KvEventPublisher):
    """No ``--kv-events-endpoint``: nothing is published."""

    def block_stored(self, block_id: int, key: Key, layers: frozenset[int],
                     parent: Key | None, token_ids: Sequence[int]) -> None:
        return None

    def block_removed(self, block_id: int, key: Key) -> None:
        return None

    def all_cleared(self) -> None:
        return None


class ZmqKvEventPublisher(KvEventPublisher):
    def __init__(self, config: KvEventsConfig) -> None:
        import zmq  # pyzmq: needed only when events are published

        self.config = config
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.replay_buffer_batches)
        self._topic = config.topic.encode()
        self._seq = 0
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm_messages)
        self._replay = None
        try:
            self.endpoint = self._bind(self._pub, config.endpoint, "--kv-events-endpoint")
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self.replay_endpoint = self._bind(self._replay, config.replay_endpoint,
                                                  "--kv-events-replay-endpoint")
        except BaseException:
            self._ctx.destroy(linger=0)
            raise
        self._closed = threading.Event()
        # Batch 0 voids whatever a predecessor at this address announced (a replica
        # restarted after a crash starts from an empty pool and from seq 0 again).
        self.all_cleared()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _bind(self, sock: Any, endpoint: str, flag: str) -> str:
        if not endpoint.startswith("tcp://"):
            raise EngineInputError(f"{flag} {endpoint!r}: expected tcp://HOST:PORT")
        try:
            sock.bind(endpoint)
        except self._zmq.ZMQError as e:
            raise EngineInputError(f"{flag} {endpoint}: {e.strerror}") from None
        return str(sock.getsockopt_string(self._zmq.LAST_ENDPOINT))

    # -- the listener (engine thread): queue and return -------------------------------
    # The pool block id and its layers stay here: vLLM's events name blocks by hash only.
    def block_stored(self, block_id: int, key: Key, layers: frozenset[int],
                     parent: Key | None, token_ids: Sequence[int]) -> None:
        self._queue.put(stored_event(key, parent, token_ids, self.config.block_tokens))

    def block_removed(self, block_id: int, key: Key) -> None:
        self._queue.put(removed_event(key))

    def all_cleared(self) -> None:
        self._queue.put(cleared_event())

    # -- the publisher thread ----------------------------------------------------------
    def _run(self) -> None:
        stopping = False
        while not stopping:
            if self._replay is not None:
                while self._replay.poll(0):
                    self._serve_replay()
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            events: list[dict[str, Any]] = []
            item: dict[str, Any] | None = first
            while True:
                if item is None:
                    stopping = True
                else:
                    events.append(item)
                if stopping or len(events) >= self.config.max_events_per_batch:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if events:
                self._publish(events)

    def _publish(self, events: list[dict[str, Any]]) -> None:
        payload = encode_batch(events, time.time())
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("kv events: ignored a malformed replay request (%d frames)",
                        len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"),
                                             payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._queue.put(None)  # after whatever is queued: it is published first
        self._thread.join(timeout=5)
        self._ctx.destroy(linger=0)


# -- the wire format (vLLM's msgspec structs: tagged maps in a positional batch) -----------

def stored_event(key: Key, parent: Key | None, token_ids: Sequence[int],
                 block_tokens: int) -> dict[str, Any]:
    # lora_id, medium and lora_name have no default in vLLM's schema: always present.
    return {"type": "BlockStored", "block_hashes": [key], "parent_block_hash": parent,
            "token_ids": list(token_ids), "block_size": block_tokens, "lora_id": None,
            "medium": MEDIUM_GPU, "lora_name": None}


def removed_event(key: Key) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [key], "medium": MEDIUM_GPU}


def cleared_event() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def encode_batch(events: list[dict[str, Any]], ts: float) -> bytes:
    """A ``KVEventBatch`` payload; data_parallel_rank 0, as vLLM's publisher fills it in for
    a single engine."""
    return msgpack.packb([ts, events, 0], use_bin_type=True)


def open_kv_event_publisher(config: KvEventsConfig | None) -> KvEventPublisher:
    """The publisher ``config`` names; no config, the null one."""
    if config is None:
        return NullKvEventPublisher()
    return ZmqKvEventPublisher(config)
