"""Engines over the fake model and real stores, and store wrappers that misbehave on cue."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from engine.connector.store_link import KVStoreLink, NullStoreLink, StoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.kv.namespace import engine_namespace
from kvstore.buffers import byte_view
from kvstore.embedded import open_embedded
from kvstore.errors import StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, Durability, KVStore, LookupResult
from tests.delegating import DelegatingStore
from tests.engine.fake_model import FakeModel, fake_spec

BT = 4
GREEDY = SamplingParams(max_new_tokens=6)


def fake_engine(
    store: KVStore | None = None,
    *,
    pool_blocks: int = 64,
    budget: int = 16,
    max_seqs: int = 8,
    load_timeout_s: float = 10.0,
    context: int = 4096,
    eos: tuple[int, ...] = (),
    max_model_len: int | None = None,
    windows: tuple[int | None, ...] | None = None,
    link_kind: type[KVStoreLink] = KVStoreLink,
    **config: object,
) -> LLMEngine:
    """``windows``: the layers' sliding windows (a hybrid model); ``link_kind``: the store
    link's class (``PrimaryOnlyLink``: a bounded engine keeping no window tails);
    ``config``: more ``EngineConfig`` fields (``cache_all_layers=True`` for exact mode,
    say)."""
    model = FakeModel(fake_spec(context=context, eos=eos, windows=windows))
    cfg = EngineConfig(
        pool_tokens=pool_blocks * BT,
        block_tokens=BT,
        max_batched_tokens=budget,
        max_num_seqs=max_seqs,
        load_timeout_s=load_timeout_s,
        attention_backend="torch",
        **({} if max_model_len is None else {"max_model_len": max_model_len}),
        **config,  # type: ignore[arg-type]
    )
    ns = engine_namespace(model.spec, BT, "", cfg.replay_policy(model.spec.layer_windows))
    link: StoreLink = NullStoreLink(ns) if store is None else link_kind(store, ns, "test")
    return LLMEngine(model, cfg, link)


def dram_store(dram_bytes: int = 4 << 20) -> KVStore:
    return open_embedded(dram_bytes=dram_bytes)


class WrappedStore(DelegatingStore):
    """A real store with hooks: ``short_get`` makes ``get_into`` copy at most that many
    blocks (the rows it leaves hold NaN, so admitting one shows in the outputs);
    ``get_delay_s`` stalls it, ``get_gate`` holds it until set and ``get_error`` makes it
    raise that (a client bug: not a ``KVStoreError``, so the link lets it through);
    ``commit_gate`` holds commits until set and ``commit_error`` makes them raise that;
    ``commit_drop`` names chain blocks the store refuses (their payloads never reach the
    inner store and count as dropped, as a full write-back drops a commit's new tail);
    ``dead`` makes every call raise ``StoreUnavailable``. ``close`` leaves the inner store
    open."""

    def __init__(self, inner: KVStore) -> None:
        super().__init__(inner)
        self.short_get: int | None = None
        self.get_delay_s = 0.0
        self.get_gate = threading.Event()
        self.get_gate.set()
        self.get_error: BaseException | None = None
        self.commit_gate = threading.Event()
        self.commit_gate.set()
        self.commit_drop: set[int] = set()
        self.commit_error: BaseException | None = None
        self.dead = False
        self.commits: list[dict[int, bytes]] = []

    def _alive(self) -> None:
        if self.dead:
            raise StoreUnavailable("test: store is down")

    def register(self, ns: Namespace, *, timeout_s: float | None = None) -> None:
        self._alive()
        super().register(ns, timeout_s=timeout_s)

    def lookup(
        self, ns: Namespace, keys: Sequence[Key], *, timeout_s: float | None = None
    ) -> LookupResult:
        self._alive()
        return super().lookup(ns, keys, timeout_s=timeout_s)

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        self._alive()
        self.get_gate.wait()
        if self.get_error is not None:
            raise self.get_error
        if self.get_delay_s:
            time.sleep(self.get_delay_s)
        if self.short_get is None:
            return super().get_into(ns, keys, dst, timeout_s=timeout_s, checksums=checksums)
        assert isinstance(dst, torch.Tensor) and dst.is_floating_point()  # engine rows
        n = min(self.short_get, len(keys))
        got = super().get_into(ns, keys[:n], dst[:n], timeout_s=timeout_s,
                               checksums=checksums) if n else 0
        dst[got : len(keys)] = float("nan")  # rows not copied: admitting one shows
        return got

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        self.commit_gate.wait()
        self._alive()
        if self.commit_error is not None:
            raise self.commit_error
        self.commits.append({i: bytes(byte_view(p)) for i, p in payloads.items()})
        kept = {i: p for i, p in payloads.items() if i not in self.commit_drop}
        res = super().commit(ns, keys, kept, durability=durability, timeout_s=timeout_s)
        return replace(res, dropped=res.dropped + len(payloads) - len(kept))

    def close(self) -> None:
        pass


def run_checked(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams = GREEDY,
                *, staggered: bool = False):
    """Generate with an integrity check after every step; ``staggered`` adds each request
    one step after the previous (so requests arrive while others prefill or load)."""
    seqs = []
    for p in prompts:
        seqs.append(engine.add_request(p, params))
        if staggered:
            engine.step()
            engine.check_integrity()
    steps = 0
    while any(not s.is_finished for s in seqs):
        engine.step()
        engine.check_integrity()
        steps += 1
        assert steps < 100_000, "engine made no progress"
    return seqs
