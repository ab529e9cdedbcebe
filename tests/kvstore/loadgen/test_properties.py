"""Property: at concurrency 1 a replay into the embedded DRAM store serves exactly what the
model predicts, for any trace of growing, prefix-sharing conversations and any capacity."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.embedded import open_embedded
from kvstore.loadgen.load import LoadConfig, LoadRun
from kvstore.loadgen.session import StoreSession

B = 256  # with 1 byte per token: 256-byte blocks, 16 per 4 KiB DRAM chunk

turn = st.tuples(st.integers(0, 5), st.integers(0, 4), st.integers(1, B))


@settings(max_examples=30, deadline=None)
@given(turns=st.lists(turn, min_size=1, max_size=40), chunks=st.integers(1, 6))
def test_measured_equals_predicted(turns: list[tuple[int, int, int]], chunks: int) -> None:
    chains: dict[int, list[int]] = {}
    next_id = 1
    rows = []
    for t, (conv, grow, tail) in enumerate(turns):
        ids = chains.setdefault(conv, [0])  # block 0: a system prompt every conversation shares
        ids.extend(range(next_id, next_id + grow))
        next_id += grow
        rows.append(
            {"timestamp": t, "input_length": (len(ids) - 1) * B + tail, "hash_ids": list(ids)}
        )
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "t.jsonl"
        trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
        store = open_embedded(chunks * 4096, dram_chunk_bytes=4096)
        try:
            load = LoadRun(
                LoadConfig(inputs=(str(trace),), block_tokens=B, bytes_per_token=1, verify=True),
                StoreSession(lambda: store, reopenable=False),
            )
            body = load.run().to_json()
            store.check_integrity()  # type: ignore[attr-defined]
        finally:
            store.close()
    assert body["tiers"]["dram"]["capacity_blocks"] == 16 * chunks
    assert body["wrong_bytes"] == 0 and body["errors"] == {}
    for key in ("hit_tokens", "input_tokens", "mean_request_hit_ratio", "tiers"):
        assert body[key] == body["predicted"][key], key
