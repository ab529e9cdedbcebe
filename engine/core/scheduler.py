"""Continuous batching over the paged pool, with the store behind it.

Each step the scheduler packs one batch under a token budget: first one token for every
running sequence that is decoding, then prefill chunks for those still prefilling, then
new admissions (first come, first served). A sequence that cannot get the blocks for its
tokens preempts the most recently admitted one (its blocks are freed and it starts over
later; what it computed stays cached in the pool and is usually a hit then).

The scheduler keeps only the budget, the order and preemption: what the pool holds for a
request (its table, prefix match, replay copies, what each block holds) is the KV
manager's (``engine.kv.kv_manager``), and everything about the store is the store
connector's (``engine.connector.store_connector``).

Admission takes the pool's longest cached prefix (tier ``hbm``). With a store, the rest
of the cacheable prefix goes to the background loader (``engine.connector.loader``): the request
waits in ``loading`` holding the blocks the store's part will land in, while running
requests keep computing. When the loader is done the request runs from where the copied
blocks end (only blocks actually copied count); when its deadline passes first, the
request recomputes instead. A hit never covers the last prompt token (``hit_cap``).

Once the hit is known, the replay planner (``engine.kv.replay_planner``) turns it into the
request's ``ReplayPlan``: with bounded replay, a hit whose last window lacks the sliding
layers starts computing ``keep`` tokens before the hit's end. The hit blocks that replay
writes into (their sliding layers) must be the request's own, so the pool's hit blocks
among them are swapped for private copies (``KVManager.start_replay``), into blocks set aside at
admission; a replay never writes a block another request may read.

When a request's prompt is computed (the step that samples its first token), and again
when it finishes, the blocks of its sequence (the prompt's, then the generated tokens') that
the store is not known to hold are copied out of the pool into bounded staging and go to the
background committer (``engine.connector.commit_planner`` says which); its pool blocks are free at
once, and under back-pressure a commit is cut short, never waited for. What a load asks
for and what it lands is ``engine.connector.load_planner``'s. What a request may be and when it
stops is ``engine.core.request_limits``'.
"""

from __future__ import annotations

import time
from collections import deque

from bounded_replay import ReplayPlan
from engine.connector.store_connector import LoadOutcome, StoreConnector
from engine.core.config import EngineConfig
from engine.core.request_limits import RequestLimits
from engine.core.scheduled_batch import ScheduledBatch
from engine.core.sequence import Sequence, SequenceStatus
from engine.errors import EngineIntegrityError
from engine.kv.kv_manager import KVManager


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        kv: KVManager,
        connector: StoreConnector,
        max_context_tokens: int,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.config = config
        self.kv = kv
        self.connector = connector
        self.limits = RequestLimits(kv, max_context_tokens, eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.loading: dict[int, Sequence] = {}
        self.running: list[Sequence] = []
        self.counters = connector.counters  # one set of request counters for the engine

    # -- requests ---------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request; refuse one that could never run (bad input, exit 2). It is
        admitted on what its prompt needs (``engine.core.request_limits``)."""
        self.limits.check(seq)
        self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.loading or self.running)

    # -- one step ---------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        self.poll()
        budget = self.config.max_batched_tokens
        prefills: list[tuple[Sequence, int]] = []
        decodes: list[Sequence] = []
        scheduled: set[int] = set()
        preemptions = self.counters["preemptions_total"]
        # Decodes first: a token each keeps every running answer moving while long prompts
        # prefill in chunks behind them.
        order = sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1)
        for seq in order:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._make_room(seq, seq.num_computed_tokens + n, scheduled):
                continue
            scheduled.add(seq.seq_id)
            budget -= n
            if n == 1:
                decodes.append(seq)
            else:
                prefills.append((seq, n))
        # After a preemption this step the pool is short: admitting now would only thrash.
        preempted = self.counters["preemptions_total"] != preemptions
        while self.waiting and budget > 0 and not preempted:
            if len(self.running) + len(self.loading) >= self.config.max_num_seqs:
                break
            seq = self.waiting[0]
            chunk = self._admit(seq, budget)
            if chunk is None:
                break  # first come, first served: later requests wait behind this one
            self.waiting.popleft()
            if chunk:
                scheduled.add(seq.seq_id)
                budget -= chunk
                if chunk == 1:
                    decodes.append(seq)
                else:
                    prefills.append((seq, chunk))
        return ScheduledBatch(tuple(prefills), tuple(decodes))

    def _make_room(self, seq: Sequence, num_tokens: int, scheduled: set[int]) -> bool:
        """Grow ``seq``'s table to ``num_tokens``, preempting the most recently admitted
        unscheduled sequences as needed. False: it waits this step."""
        while not self.kv.grow(seq, num_tokens):
            victims = [s for s in self.running if s is not seq and s.seq_id not in scheduled]
            if not victims:
                return False
            self._preempt(victims[-1])
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.reset_replay()
        seq.stats.preemptions += 1
        self.counters["preemptions_total"] += 1
        seq.stats.reset_admission()
        self.waiting.appendleft(seq)

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Take the pool's hit and start the store load or the first chunk. Returns the
        chunk scheduled now (0 while loading), or None when the pool lacks the blocks."""
        if seq.stats.admitted_s is None:
            seq.stats.admitted_s = time.perf_counter()
        hit = self.kv.match(seq)
        need = self.connector.match(seq, hit)
        if need is not None:
            if need.blocks > hit.free_after:
                return None
            self.connector.start_load(seq, hit, need)
            seq.status = SequenceStatus.LOADING
            self.loading[seq.seq_id] = seq
            return 0
        plan = self.kv.plan(seq, self.kv.has_sliding(hit.blocks))
        used = hit.blocks[: plan.hit_blocks]
        start = plan.replay_start_tokens
        chunk = min(seq.num_tokens - start, budget)
        need_blocks = (max(0, self.kv.blocks_for(start + chunk) - len(used))
                       + len(plan.replay_blocks))
        if need_blocks > self.kv.free_after(used):
            return None
        self.kv.open(seq, used, lookup_blocks=hit.cap_blocks)
        self._note_hit(seq, "hbm", len(used))
        self._start_running(seq, plan, pool_blocks=len(used))
        if not self.kv.grow(seq, start + chunk):
            raise EngineIntegrityError("pool lost free blocks during admission")
        return chunk

    def _note_hit(self, seq: Sequence, tier: str, first: int, count: int | None = None) -> None:
        """Hit tokens of a tier, counted over prompt positions only."""
        bt, p = self.kv.block_tokens, seq.num_prompt_tokens
        start, end = (0, first) if count is None else (first, first + count)
        seq.stats.hit_tokens[tier] += max(0, min(end * bt, p) - min(start * bt, p))

    def _start_running(self, seq: Sequence, plan: ReplayPlan, pool_blocks: int) -> None:
        """Run ``seq`` from its plan's replay start. Its table holds the hit (the pool's
        ``pool_blocks`` first, then what the store filled) and maybe fresh blocks after it;
        a hit the plan shortened gives back the blocks past it."""
        self.kv.start_replay(seq, plan, pool_blocks)
        seq.plan = plan
        seq.num_computed_tokens = plan.replay_start_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    # -- background completions -------------------------------------------------------
    def poll(self) -> None:
        """Take in finished store transfers: requests whose load is over start running."""
        self.connector.poll(self._loaded)

    def _loaded(self, out: LoadOutcome) -> None:
        seq = out.seq
        del self.loading[seq.seq_id]
        plan = self.kv.plan(seq, out.has_sliding)
        self._note_hit(seq, "hbm", min(out.pool_blocks, plan.hit_blocks))
        for j, tier in enumerate(out.tiers[: max(0, plan.hit_blocks - out.pool_blocks)]):
            self._note_hit(seq, tier, out.pool_blocks + j, 1)
        self._start_running(seq, plan, pool_blocks=out.pool_blocks)

    # -- after the forward pass -------------------------------------------------------
    def update(self, batch: ScheduledBatch, sampled: dict[int, int]) -> list[Sequence]:
        """Advance the scheduled sequences by their tokens, index newly full blocks,
        append sampled tokens and finish what stops. Returns the finished sequences."""
        finished: list[Sequence] = []
        now = time.perf_counter()
        steps = [*batch.prefills, *((s, 1) for s in batch.decodes)]
        for seq, n in steps:
            start = seq.num_computed_tokens
            seq.num_computed_tokens += n
            seq.stats.computed_tokens += max(0, min(start + n, seq.num_prompt_tokens) - start)
            if seq.plan is not None:  # the hit's own tokens run again: a replay
                seq.stats.replayed_tokens += max(0, min(start + n, seq.plan.hit_tokens) - start)
            self.kv.cache_computed(seq)
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a prefill chunk short of the end: no token yet
            if start < seq.num_prompt_tokens:
                # The prompt is computed: its blocks go to the store now, not at the end.
                self.connector.on_prefilled(seq)
            seq.token_ids.append(sampled[seq.seq_id])
            if seq.stats.first_token_s is None:
                seq.stats.first_token_s = now
            seq.stats.last_token_s = now
            reason = self.limits.stop_reason(seq)
            if reason is not None:
                seq.finish_reason = reason
                self._finish(seq)
                finished.append(seq)
        return finished

    def abort(self, seq: Sequence) -> None:
        """Stop ``seq`` now, wherever it is (a client went away): its blocks are freed at
        once; what it computed is committed like a finished request's. No-op once done."""
        if seq.status is SequenceStatus.FINISHED:
            return
        seq.finish_reason = "abort"
        self.counters["aborted_total"] += 1
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            seq.status = SequenceStatus.FINISHED
            self._seal(seq)
            return
        if seq.status is SequenceStatus.LOADING:
            del self.loading[seq.seq_id]
            self.connector.abort_load(seq)  # the loader stops; its blocks go when it reports
            self.kv.free(seq)  # its table and the room set aside for a replay's copies
            seq.status = SequenceStatus.FINISHED
            self._seal(seq)
            return
        self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        try:
            self.connector.on_finish(seq)  # best-effort: copies out what the store lacks
        finally:
            self.kv.free(seq)
            self._seal(seq)

    @staticmethod
    def _seal(seq: Sequence) -> None:
        """Every commit job of ``seq`` is submitted (maybe none): its waiter may return."""
        if seq.commit_receipt is not None:
            seq.commit_receipt.seal()

    def check_integrity(self) -> None:
        """The pool's accounting, and each sequence's blocks against its state."""
        self.kv.check_integrity()
        bt = self.kv.block_tokens
        for seq in self.waiting:
            if self.kv.holds(seq) or seq.status is not SequenceStatus.WAITING:
                raise EngineIntegrityError(f"waiting {seq} holds blocks or has another status")
        if set(self.loading) != set(self.connector.loading_ids):
            raise EngineIntegrityError("the scheduler and the connector disagree on loads")
        for seq in self.loading.values():
            if seq.status is not SequenceStatus.LOADING or not self.kv.holds(seq):
                raise EngineIntegrityError(f"loading {seq} is not loading or holds nothing")
        for seq in (*self.waiting, *self.loading.values(), *self.running):
            if seq.commit_receipt is not None and seq.commit_receipt.done:
                raise EngineIntegrityError(f"{seq} is unfinished but its commit receipt is done")
        for seq in self.running:
            if seq.status is not SequenceStatus.RUNNING:
                raise EngineIntegrityError(f"running list holds {seq}")
            table = self.kv.table(seq)
            if len(table) * bt < seq.num_computed_tokens:
                raise EngineIntegrityError(f"{seq} computed past its {len(table)} blocks")
            known = max(seq.num_computed_tokens, seq.plan.hit_tokens if seq.plan else 0)
            if self.kv.num_cached_blocks(seq) > known // bt:
                raise EngineIntegrityError(f"{seq} indexed blocks it has not computed")
