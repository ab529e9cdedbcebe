"""Bounds on what one request may ask of a server (the cache daemon or a storage node)."""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.errors import InvalidArgument
from kvstore.wire.codec import MAX_KEYS_PER_REQUEST


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Bounds on what one request may ask of the daemon (memory safety: a request is
    buffered whole so a malformed one can be refused without side effects).

    ``max_request_bytes`` bounds one call's payload buffer (more is misuse:
    INVALID_ARGUMENT); ``max_inflight_bytes`` bounds the buffers of all calls together
    (more waits for nobody: RESOURCE_EXHAUSTED, the client retries within its deadline);
    a streaming call whose client moves nothing for ``stream_idle_timeout_s`` (the time
    the daemon waits on it, not the daemon's own work) is cancelled."""

    max_keys_per_request: int = MAX_KEYS_PER_REQUEST
    max_request_bytes: int = 256 << 20
    max_inflight_bytes: int = 1 << 30
    stream_idle_timeout_s: float = 30.0
    max_staging_segment_bytes: int = 1 << 30
    max_staging_total_bytes: int = 8 << 30

    def __post_init__(self) -> None:
        if not 0 < self.max_keys_per_request <= MAX_KEYS_PER_REQUEST:
            raise InvalidArgument(
                f"max_keys_per_request must be in [1, {MAX_KEYS_PER_REQUEST}] (the wire limit)"
            )
        if not 0 < self.max_request_bytes <= self.max_inflight_bytes:
            raise InvalidArgument("max_request_bytes must be in (0, max_inflight_bytes]")
        if not self.stream_idle_timeout_s > 0:
            raise InvalidArgument("stream_idle_timeout_s must be positive")
