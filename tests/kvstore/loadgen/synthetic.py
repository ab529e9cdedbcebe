"""Small synthetic traces that always exist: conversations that grow a shared prefix.

Mooncake-style JSONL: ids chain the prefix (equal ids mean equal prefixes), every
conversation opens with the same system-prompt blocks, each turn re-sends the whole
conversation plus a few new blocks. kv-cache-tester-style session files reuse the same
local ids in every file (``hash_id_scope: local``), so only per-file namespaces keep them
apart.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SYSTEM_BLOCKS = 3


def conversation_trace(
    path: Path,
    *,
    conversations: int = 24,
    turns: int = 6,
    block_tokens: int = 512,
    seed: int = 7,
    spacing_ms: int = 20,
) -> Path:
    """Write a Mooncake JSONL trace; requests of all conversations interleave in time."""
    rng = np.random.default_rng(seed)
    next_id = SYSTEM_BLOCKS
    rows = []
    for c in range(conversations):
        ids = list(range(SYSTEM_BLOCKS))
        start = int(rng.integers(0, conversations * spacing_ms * 2))
        for t in range(turns):
            grow = int(rng.integers(1, 4))
            ids = ids + list(range(next_id, next_id + grow))
            next_id += grow
            tail = int(rng.integers(1, block_tokens))  # the last block is partial
            length = (len(ids) - 1) * block_tokens + tail
            ts = start + t * conversations * spacing_ms + c
            rows.append(
                {
                    "timestamp": ts,
                    "input_length": length,
                    "output_length": 10,
                    "hash_ids": list(ids),
                }
            )
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def session_traces(directory: Path, *, sessions: int = 3, turns: int = 5, seed: int = 3) -> Path:
    """kv-cache-tester session files with B = 64 and the same local ids in every file."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for s in range(sessions):
        ids: list[int] = []
        reqs = []
        for t in range(turns):
            ids = ids + list(range(len(ids), len(ids) + int(rng.integers(2, 6))))
            reqs.append(
                {
                    "t": float(t) + 0.1 * s,
                    "in": len(ids) * 64 + int(rng.integers(0, 64)),
                    "out": 5,
                    "hash_ids": list(ids),
                    "type": "n",
                }
            )
        doc = {"block_size": 64, "hash_id_scope": "local", "requests": reqs}
        (directory / f"session_{s:02d}.json").write_text(json.dumps(doc))
    return directory
