"""Writers for every input format of ``kvstore hitrate``, shared by its tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from kvstore.accesslog.schema import ACCESS_LOG_SCHEMA

MoonRow = tuple[float, int, Sequence[int]]  # (timestamp ms, input_length, hash_ids)


def write_mooncake_jsonl(path: Path, rows: Sequence[MoonRow]) -> Path:
    with open(path, "w") as f:
        for ts, big_l, ids in rows:
            obj = {
                "timestamp": ts,
                "input_length": big_l,
                "output_length": 1,
                "hash_ids": list(ids),
            }
            f.write(json.dumps(obj) + "\n")
    return path


def mooncake_table(rows: Sequence[MoonRow]) -> pa.Table:
    return pa.table(
        {
            "timestamp": pa.array([r[0] for r in rows], pa.int64()),
            "input_length": pa.array([r[1] for r in rows], pa.int64()),
            "output_length": pa.array([1] * len(rows), pa.int64()),
            "hash_ids": pa.array([list(r[2]) for r in rows], pa.list_(pa.int64())),
        }
    )


def write_mooncake_parquet(path: Path, rows: Sequence[MoonRow], row_group_size: int = 2) -> Path:
    pq.write_table(mooncake_table(rows), path, row_group_size=row_group_size)
    return path


def write_mooncake_arrow(path: Path, rows: Sequence[MoonRow], *, stream: bool = False) -> Path:
    table = mooncake_table(rows)
    with pa.OSFile(str(path), "wb") as sink:
        opener = ipc.new_stream if stream else ipc.new_file
        with opener(sink, table.schema) as w:
            for batch in table.to_batches(max_chunksize=2):
                w.write_batch(batch)
    return path


def kvct_request(t: float, big_l: int, ids: Sequence[int], **extra: Any) -> dict[str, Any]:
    return {"t": t, "type": "n", "in": big_l, "out": 1, "hash_ids": list(ids), **extra}


def write_kvct(path: Path, requests: list[dict[str, Any]], block_size: int = 64) -> Path:
    doc = {
        "id": path.stem,
        "models": ["m"],
        "block_size": block_size,
        "hash_id_scope": "local",
        "requests": requests,
    }
    path.write_text(json.dumps(doc))
    return path


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


AccessRow = tuple[int, int, int, Sequence[int]]  # (ts_us, block_tokens, prompt_tokens, key ids)


def access_log_table(rows: Sequence[AccessRow], namespace: bytes = b"\x01" * 16) -> pa.Table:
    n = len(rows)
    return pa.Table.from_pydict(
        {
            "ts_us": [r[0] for r in rows],
            "tenant": [""] * n,
            "namespace": [namespace] * n,
            "block_tokens": [r[1] for r in rows],
            "prompt_tokens": [r[2] for r in rows],
            "keys": [[key(k) for k in r[3]] for r in rows],
            "hit_blocks": [0] * n,
            "hit_hbm": [0] * n,
            "hit_dram": [0] * n,
            "hit_ssd": [0] * n,
        },
        schema=ACCESS_LOG_SCHEMA,
    )


def write_access_log(path: Path, rows: Sequence[AccessRow]) -> Path:
    pq.write_table(access_log_table(rows), path, row_group_size=2)
    return path
