"""Fixtures of the load-generator tests: synthetic traces and an in-process store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore.embedded import open_embedded
from kvstore.loadgen.load import LoadConfig, LoadRun
from kvstore.loadgen.session import StoreSession
from kvstore.tier import KVStore
from tests.kvstore.loadgen.synthetic import conversation_trace, session_traces


@pytest.fixture
def conv_trace(tmp_path: Path) -> Path:
    return conversation_trace(tmp_path / "conv.jsonl")


@pytest.fixture
def sessions_dir(tmp_path: Path) -> Path:
    return session_traces(tmp_path / "sessions")


RunLoad = Callable[..., LoadRun]


@pytest.fixture
def embedded_run() -> Iterator[RunLoad]:
    """``embedded_run(trace, dram_bytes=…, wrap=None, **LoadConfig fields)`` replays into a
    fresh embedded store and returns the finished ``LoadRun`` (its ``report_`` attached)."""
    stores: list[KVStore] = []

    def run(trace: Path, *, dram_bytes: int = 16 << 20, wrap=None, **fields) -> LoadRun:
        store: KVStore = open_embedded(dram_bytes)
        stores.append(store)
        if wrap is not None:
            store = wrap(store)
        session = StoreSession(lambda: store, reopenable=False)
        fields.setdefault("bytes_per_token", 4)
        load = LoadRun(LoadConfig(inputs=(str(trace),), **fields), session)
        load.report_ = load.run()  # type: ignore[attr-defined]
        return load

    yield run
    for s in stores:
        s.close()
