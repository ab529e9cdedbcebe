"""The engine: a model, its paged KV pool, the scheduler and the store behind them.

``LLMEngine`` owns everything a step needs and runs steps on the calling thread; only
the store transfers run on their own threads (``engine.kv.loader``,
``engine.kv.committer``). ``close()`` waits for the pending commits, so what one process
computed is in the store when the next one starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

import kernels
from engine.config import EngineConfig
from engine.errors import EngineInputError
from engine.kv.block_manager import BlockManager
from engine.kv.cache import KVCache, KVCacheShape
from engine.kv.committer import KVCommitter
from engine.kv.loader import KVLoader
from engine.kv.namespace import engine_namespaces
from engine.kv.replay_planner import ReplayPlanner
from engine.kv.request_scope import IDENTITY, RequestScope
from engine.kv.store_link import StoreLink
from engine.model.base import CausalLM
from engine.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from kernels.threads import pin_compute_threads, thread_plan
from kvstore.tier import TierStats

if TYPE_CHECKING:
    from engine.structured.backend import GrammarBackend


def model_device(model: CausalLM) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


class LLMEngine:
    def __init__(self, model: CausalLM, config: EngineConfig, link: StoreLink) -> None:
        spec = model.spec
        self.model = model
        self.config = config
        self.link = link
        self.ns = link.ns
        if self.ns.block_tokens != config.block_tokens:
            raise ValueError("the namespace and the engine disagree on block_tokens")
        self.policy = config.replay_policy(spec.layer_windows)
        # Prompt plus answer, at most (--max-model-len, else the model's context).
        self.max_context_tokens = config.context_tokens(spec.max_context_tokens)
        self.namespaces = engine_namespaces(spec, config.block_tokens, self.policy,
                                            tenant=self.ns.tenant)
        if self.ns != self.namespaces.primary:
            raise ValueError(
                f"the store link's namespace {self.ns} is not this engine's "
                f"{self.namespaces.primary} ({self.policy.describe()})")
        sliding = self.namespaces.sliding
        self.sliding_link = None if sliding is None else link.sibling(sliding)
        device = model_device(model)
        self.cache = KVCache(
            KVCacheShape(
                num_layers=spec.num_layers,
                num_blocks=config.num_blocks,
                block_tokens=config.block_tokens,
                kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                dtype=spec.dtype,
            ),
            device,
        )
        self.backend = kernels.resolve_backend(config.attention_backend, device)
        self.blocks = BlockManager(
            config.num_blocks, config.block_tokens, self.cache.shape.bytes_per_block
        )
        self._progress = threading.Event()
        self.planner = ReplayPlanner(self.policy, config.block_tokens)
        layers = self.ns.cached_layers  # the primary namespace's; a job may name another
        self.loader = KVLoader(
            link, self.cache, layers, self.backend, self._progress,
            config.store_call_timeout_s, sliding_link=self.sliding_link,
            window_first_block=self.planner.window_first_block,
        )
        self.committer = KVCommitter(
            link, self.cache, layers, self.backend, self._progress, config.commit_timeout_s,
            staging_bytes=config.commit_staging_bytes,
        )
        self.scheduler = Scheduler(
            config,
            self.blocks,
            self.ns,
            link,
            self.loader,
            self.committer,
            max_context_tokens=self.max_context_tokens,
            eos_token_ids=spec.eos_token_ids,
            planner=self.planner,
            copy_blocks=self.cache.copy_blocks,
            sliding_link=self.sliding_link,
        )
        self.runner = ModelRunner(model, self.cache, self.blocks, self.backend)
        # Structured outputs (engine.structured.backend.GrammarBackend), set by a server
        # that offers them: a request with ``params.constraint`` gets a matcher from it.
        self.grammar: GrammarBackend | None = None
        self.threads = thread_plan()
        self._closed = False

    # -- requests ---------------------------------------------------------------------
    def add_request(self, token_ids: Iterable[int], params: SamplingParams,
                    scope: RequestScope = IDENTITY) -> Sequence:
        """Queue a request; ``scope`` (tenant, cache salt) decides whose cached blocks it
        may hit (``engine.kv.request_scope``). Bad input raises ``EngineInputError``."""
        seq = Sequence(list(token_ids), params, scope)
        if params.constraint is not None:
            if self.grammar is None:
                raise EngineInputError("this engine has no grammar backend for structured "
                                       "outputs")
            seq.constraint = self.grammar.matcher(params.constraint)
        self.scheduler.add(seq)
        return seq

    def abort(self, seq: Sequence) -> None:
        """Stop a request now (its client went away): its pool blocks are freed, what it
        computed is committed. ``finish_reason`` becomes ``"abort"``."""
        self.scheduler.abort(seq)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def step(self) -> list[Sequence]:
        """Run one batch (or, when every admitted request waits on the store, wait for the
        store briefly). Returns the requests that finished in this step."""
        self._progress.clear()
        pin_compute_threads(self.threads)  # whichever thread steps: the server's loop too
        batch = self.scheduler.schedule()
        if batch.is_empty:
            if self.scheduler.has_unfinished:
                # Loads in flight holding the blocks a request needs.
                self._progress.wait(timeout=0.05)
            return []
        sampled = self.runner.run(batch)
        return self.scheduler.update(batch, sampled)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sequence]:
        """Run ``prompts`` together to completion (continuous batching)."""
        seqs = [self.add_request(p, params) for p in prompts]
        while any(not s.is_finished for s in seqs):
            self.step()
        return seqs

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every finished request's commit has reached the store."""
        ok = self.committer.wait_idle(timeout_s)
        self.scheduler.poll()
        return ok

    # -- introspection ----------------------------------------------------------------
    def hbm_stats(self) -> TierStats:
        return self.blocks.stats()

    @property
    def stored_bytes_per_token(self) -> float:
        """KV bytes the store keeps per token under this engine's replay policy."""
        return self.namespaces.bytes_per_token

    def store_counters(self) -> dict[str, int]:
        """The store links' counters, summed over the namespaces."""
        out: dict[str, int] = {}
        for link in (self.link, self.sliding_link):
            for k, v in (link.counters() if link is not None else {}).items():
                out[k] = out.get(k, 0) + v
        return out

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
        self.committer.staging.check_integrity()

    def close(self) -> None:
        """Finish pending commits (bounded by ``close_timeout_s``), then stop the threads
        and close the store (which flushes what it accepted)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.config.close_timeout_s
        self.drain(max(0.0, deadline - time.monotonic()))
        self.loader.close()
        self.committer.close()
        if self.sliding_link is not None:
            self.sliding_link.close()
        self.link.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
