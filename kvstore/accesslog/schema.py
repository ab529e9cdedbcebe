"""The access-log Parquet schema of DESIGN §8, the one definition writer and readers share.

The daemon writes it and ``kvstore hitrate`` reads it; both import ``ACCESS_LOG_SCHEMA``
from here so that a renamed field or a changed type breaks a test instead of a replay.
"""

from __future__ import annotations

import pyarrow as pa

KEY_BYTES = 16
"""Every namespace fingerprint and chain key is a 16-byte xxh3-128 / blake2b-128 digest."""

ACCESS_LOG_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("ts_us", pa.int64(), nullable=False),
        pa.field("tenant", pa.string(), nullable=False),
        pa.field("namespace", pa.binary(KEY_BYTES), nullable=False),
        pa.field("block_tokens", pa.int32(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("keys", pa.list_(pa.binary(KEY_BYTES)), nullable=False),
        pa.field("hit_blocks", pa.int32(), nullable=False),
        pa.field("hit_hbm", pa.int32(), nullable=False),
        pa.field("hit_dram", pa.int32(), nullable=False),
        pa.field("hit_ssd", pa.int32(), nullable=False),
    ]
)
"""Field names, order and types exactly as DESIGN §8 lists them (``binary(16)`` is Arrow's
fixed-size binary; ``prompt_tokens`` is 0 when the client did not say)."""

__all__ = ["ACCESS_LOG_SCHEMA", "KEY_BYTES"]
