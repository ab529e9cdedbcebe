"""One request as the engine tracks it: its tokens, how far its KV is computed, where its
hits came from and when its tokens appeared."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from bounded_replay import ReplayPlan
from engine.connector.handoff import CommitReceipt, PrefillCommit
from engine.core.sampling_params import SamplingParams
from engine.kv.request_scope import IDENTITY, RequestScope
from kvstore.keys import Key, Namespace

_ids = itertools.count()

TIERS = ("hbm", "dram", "ssd")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token's log probability under the model (its raw logits) and the ``k``
    most likely tokens at that position, best first (what ``logprobs`` asks a sequence to
    keep; the sampler appends one per token)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


class SequenceStatus(Enum):
    WAITING = "waiting"  # not admitted: holds no blocks
    LOADING = "loading"  # admitted, its cached prefix is being copied in from the store
    RUNNING = "running"  # admitted, prefilling or decoding
    FINISHED = "finished"


@dataclass
class SequenceStats:
    """What one request cost. Hits and computed tokens describe the admission that ran it to
    the end (a preempted request starts over; ``preemptions`` counts how often)."""

    arrival_s: float = field(default_factory=time.perf_counter)
    admitted_s: float | None = None  # first admission (the queue time ends there)
    store_lookup_s: float = 0.0  # time in the store's lookup for this request
    store_load_s: float = 0.0  # time copying its hit in from the store
    first_token_s: float | None = None
    last_token_s: float | None = None
    hit_tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    computed_tokens: int = 0  # prompt tokens that went through the model
    # Of those, tokens of the hit replayed (bounded replay): cached_tokens = hit − replayed.
    replayed_tokens: int = 0
    preemptions: int = 0
    load_gave_up: int = 0  # store loads abandoned at their deadline

    @property
    def ttft_s(self) -> float:
        return (self.first_token_s or self.arrival_s) - self.arrival_s

    def decode_tokens_per_s(self, num_output_tokens: int) -> float:
        """Tokens after the first over the time they took (0 when there is no second)."""
        if self.first_token_s is None or self.last_token_s is None or num_output_tokens < 2:
            return 0.0
        span = self.last_token_s - self.first_token_s
        return (num_output_tokens - 1) / span if span > 0 else 0.0

    def reset_admission(self) -> None:
        self.hit_tokens = dict.fromkeys(TIERS, 0)
        self.computed_tokens = 0
        self.replayed_tokens = 0


class Sequence:
    def __init__(self, token_ids: list[int], params: SamplingParams,
                 scope: RequestScope = IDENTITY) -> None:
        self.seq_id = next(_ids)
        # Whose blocks this request may hit: every namespace it names goes through it.
        self.scope = scope
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        # Tokens whose K/V are in the pool; the rest are computed by the next steps.
        self.num_computed_tokens = 0
        # The admission's replay plan (bounded_replay), set when the request starts running:
        # where its prefill started and which layers hold KV from where.
        self.plan: ReplayPlan | None = None
        self.stats = SequenceStats()
        self.finish_reason: str | None = None
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator()
            self.generator.manual_seed(params.seed if params.seed is not None else self.seq_id)
        # Chain keys per namespace, as far as computed (``engine.kv.kv_manager.keys`` fills
        # it: the KV manager names blocks, the request only carries the memo).
        self.key_memo: dict[Namespace, list[Key]] = {}
        # One entry per output token when ``params.logprobs`` is set (engine.core.sampler).
        self.logprobs: list[TokenLogprob] = []
        # The grammar's matcher when ``params.constraint`` is set (engine.structured).
        self.constraint: Any = None
        # Set for a prefill replica's request (engine.connector.handoff): the caller waits on it
        # for this request's commit, which is otherwise never waited for.
        self.commit_receipt: CommitReceipt | None = None
        # Its prompt's commit, sent when its prefill completed (the store connector's).
        self.prefill_commit: PrefillCommit | None = None

    def __repr__(self) -> str:
        return (f"Sequence({self.seq_id}, {self.status.value}, tokens={len(self.token_ids)}, "
                f"computed={self.num_computed_tokens})")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def namespace(self, ns: Namespace) -> Namespace:
        """The engine namespace ``ns`` as this request sees it (its tenant, its salt)."""
        return self.scope.apply(ns)

    def reset_replay(self) -> None:
        self.plan = None
