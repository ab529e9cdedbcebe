"""The engine: a model, its paged KV pool, the scheduler and the store behind them.

``LLMEngine`` owns everything a step needs and runs steps on the calling thread: the KV
manager (``engine.kv.kv_manager``: what the pool holds for each request), the store
connector (``engine.connector.store_connector``: everything about the store), the
scheduler between them and the model runner. Only the store transfers run on their own
threads (``engine.connector.loader``, ``engine.connector.committer``). ``close()`` waits
for the pending commits, so what one process computed is in the store when the next one
starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

import kernels
from engine.connector.handoff import CommitReceipt, visible_blocks, wait_visible
from engine.connector.store_connector import StoreConnector
from engine.connector.store_link import StoreLink
from engine.core.config import EngineConfig
from engine.core.model_runner import ModelRunner
from engine.core.numerics import numerics_for
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.errors import EngineInputError
from engine.kv.cache import KVCache, KVCacheShape
from engine.kv.kv_manager import KVManager
from engine.kv.namespace import engine_namespaces
from engine.kv.replay_planner import ReplayPlanner
from engine.kv.request_scope import IDENTITY, RequestScope
from engine.model.base import CausalLM
from kernels.threads import pin_compute_threads, thread_plan
from kvstore.keys import Key, Namespace, chain_keys
from kvstore.prefix_key import PrefixHash
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
                                            tenant=self.ns.tenant,
                                            prefix_hash=PrefixHash.of(self.ns))
        if self.ns != self.namespaces.primary:
            raise ValueError(
                f"the store link's namespace {self.ns} is not this engine's "
                f"{self.namespaces.primary} ({self.policy.describe()})")
        sliding = self.namespaces.sliding
        self.sliding_link = None if sliding is None else link.sibling(sliding)
        device = model_device(model)
        layout = config.kv_layout(spec.layer_windows)
        self.cache = KVCache(
            KVCacheShape(
                num_layers=spec.num_layers,
                num_blocks=config.num_pages(layout),
                block_tokens=config.block_tokens,
                kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                dtype=spec.dtype,
                layout=layout,
            ),
            device,
        )
        self.numerics = numerics_for(config.deterministic)
        self.backend = kernels.resolve_backend(
            self.numerics.backend_name(config.attention_backend), device)
        self.kv = KVManager(self.cache, ReplayPlanner(self.policy, config.block_tokens),
                            self.ns, cache_generated_tokens=config.cache_generated_tokens,
                            max_chunk_tokens=config.max_batched_tokens)
        self._progress = threading.Event()
        self.connector = StoreConnector(link, self.sliding_link, self.kv, self.cache,
                                        self.backend, config, self._progress)
        self.scheduler = Scheduler(config, self.kv, self.connector,
                                   max_context_tokens=self.max_context_tokens,
                                   eos_token_ids=spec.eos_token_ids)
        # Read-only views for servers and tests: the pool's tables, the replay planner and
        # the transfer threads (their owners are the KV manager and the connector).
        self.blocks = self.kv.blocks
        self.planner = self.kv.planner
        self.loader = self.connector.loader
        self.committer = self.connector.committer
        compiler = self.numerics.compiler(config.compile_step)
        self.runner = ModelRunner(compiler.prepare(self.numerics.prepare(model)), self.cache,
                                  self.kv, self.backend, row_cut=config.replay_row_cut)
        # Structured outputs (engine.structured.backend.GrammarBackend), set by a server
        # that offers them: a request with ``params.constraint`` gets a matcher from it.
        self.grammar: GrammarBackend | None = None
        self.threads = thread_plan()
        self._closed = False

    # -- requests ---------------------------------------------------------------------
    def add_request(self, token_ids: Iterable[int], params: SamplingParams,
                    scope: RequestScope = IDENTITY,
                    commit_receipt: CommitReceipt | None = None) -> Sequence:
        """Queue a request; ``scope`` (tenant, cache salt) decides whose cached blocks it
        may hit (``engine.kv.request_scope``). ``commit_receipt``: told when the request's
        commit is over (a prefill replica waits for it, ``engine.connector.handoff``). Bad input
        raises ``EngineInputError``."""
        seq = Sequence(list(token_ids), params, scope)
        seq.commit_receipt = commit_receipt
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
        ok = self.connector.drain(timeout_s)
        self.scheduler.poll()
        return ok

    # -- prefill/decode hand-off (engine.connector.handoff; any thread) -------------------------
    def _prompt_chain(self, token_ids: list[int], scope: RequestScope
                      ) -> tuple[Namespace, list[Key]]:
        ns = scope.apply(self.ns)
        full = len(token_ids) // ns.block_tokens
        return ns, chain_keys(ns, token_ids[: full * ns.block_tokens])

    def visible_prompt_blocks(self, token_ids: list[int], scope: RequestScope = IDENTITY
                              ) -> int:
        """Leading full blocks of ``token_ids`` (as ``scope`` sees them) the store serves
        now: what a prefill replica tells its decode replica once its commit is over."""
        ns, keys = self._prompt_chain(token_ids, scope)
        return visible_blocks(self.link, ns, keys, self.config.store_call_timeout_s)

    def wait_prompt_blocks(self, token_ids: list[int], blocks: int, timeout_s: float,
                           scope: RequestScope = IDENTITY) -> int:
        """Wait (at most ``timeout_s``) until the store serves ``blocks`` leading blocks of
        ``token_ids``; returns those it serves then. A decode replica calls it before it
        admits a request whose prompt another replica computed."""
        ns, keys = self._prompt_chain(token_ids, scope)
        return wait_visible(self.link, ns, keys, blocks, timeout_s,
                            self.config.store_call_timeout_s)

    def namespace_of(self, scope: RequestScope = IDENTITY) -> Namespace:
        """The primary namespace a request of ``scope`` uses."""
        return scope.apply(self.ns)

    # -- introspection ----------------------------------------------------------------
    def hbm_stats(self) -> TierStats:
        return self.kv.stats()

    def stored_bytes_per_token(self, context_tokens: int) -> float:
        """KV bytes the store keeps per token of a context of ``context_tokens`` committed
        at one end, under this engine's replay policy (bounded mode: the full layers of
        every token plus that end's window tail, ``StoredNamespaces.bytes_per_token``)."""
        return self.namespaces.bytes_per_token(context_tokens)

    def store_counters(self) -> dict[str, int]:
        """The store links' counters, summed over the namespaces."""
        return self.connector.store_counters()

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
        self.connector.check_integrity()

    def close(self) -> None:
        """Finish pending commits (bounded by ``close_timeout_s``), then stop the threads
        and close the store (which flushes what it accepted)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + self.config.close_timeout_s
        self.drain(max(0.0, deadline - time.monotonic()))
        self.connector.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
