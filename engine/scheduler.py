"""Continuous batching over the paged pool, with the store behind it.

Each step the scheduler packs one batch under a token budget: first one token for every
running sequence that is decoding, then prefill chunks for those still prefilling, then
new admissions (first come, first served). A sequence that cannot get the blocks for its
tokens preempts the most recently admitted one (its blocks are freed and it starts over
later; what it computed stays cached in the pool and is usually a hit then).

Admission takes the pool's longest cached prefix (tier ``hbm``). With a store, the rest
of the cacheable prefix goes to the background loader (``engine.kv.loader``): the request
waits in ``loading`` holding the blocks the store's part will land in, while running
requests keep computing. When the loader is done the request runs from where the copied
blocks end (only blocks actually copied count); when its deadline passes first, the
request recomputes instead. A hit never covers the last prompt token (``hit_cap``).

Once the hit is known, the replay planner (``engine.kv.replay_planner``) turns it into the
request's ``ReplayPlan``: with bounded replay, a hit whose last window lacks the sliding
layers starts computing ``keep`` tokens before the hit's end. The hit blocks that replay
writes into (their sliding layers) must be the request's own, so the pool's hit blocks
among them are swapped for private copies (``privatize``), into blocks set aside at
admission; a replay never writes a block another request may read.

When a request finishes, the blocks of its sequence (prompt and generated tokens) that the
store is not known to hold are copied out of the pool into bounded staging and go to the
background committer (``engine.kv.commit_planner`` says which); its pool blocks are free at
once, and under back-pressure a commit is cut short, never waited for. What a load asks
for and what it lands is ``engine.kv.load_planner``'s. What a request may be and when it
stops is ``engine.request_limits``'.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque
from collections.abc import Callable

from bounded_replay import ReplayPlan
from engine.config import EngineConfig
from engine.errors import EngineIntegrityError
from engine.kv.block_manager import BlockManager
from engine.kv.commit_planner import CommitPlanner
from engine.kv.committer import KVCommitter
from engine.kv.load_planner import LoadPlanner
from engine.kv.loader import KVLoader, LoadJob
from engine.kv.replay_planner import ReplayPlanner
from engine.kv.store_link import StoreLink
from engine.kv.transfer import note_job_error
from engine.request_limits import RequestLimits
from engine.scheduled_batch import ScheduledBatch
from engine.sequence import Sequence, SequenceStatus
from kvstore.keys import Namespace


def _owner(seq: Sequence) -> tuple[str, int]:
    return ("seq", seq.seq_id)


def _reserve(seq: Sequence) -> tuple[str, int]:
    """The blocks set aside at admission for the private copies a replay may need."""
    return ("reserve", seq.seq_id)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        blocks: BlockManager,
        ns: Namespace,
        link: StoreLink,
        loader: KVLoader,
        committer: KVCommitter,
        max_context_tokens: int,
        eos_token_ids: tuple[int, ...] = (),
        *,
        planner: ReplayPlanner,
        copy_blocks: Callable[[list[tuple[int, int]]], None],
        sliding_link: StoreLink | None = None,
    ) -> None:
        """``copy_blocks``: copies pool blocks (old, new) on the engine thread.
        ``sliding_link``: exact mode for a hybrid model, the sliding layers' namespace."""
        self.config = config
        self.blocks = blocks
        self.ns = ns
        self.link = link
        self.planner = planner
        self.copy_blocks = copy_blocks
        self.links = (link,) if sliding_link is None else (link, sliding_link)
        self.loader = loader
        self.committer = committer
        self.limits = RequestLimits(blocks, planner, max_context_tokens, eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.loading: dict[int, tuple[Sequence, LoadJob]] = {}
        self.running: list[Sequence] = []
        self._job_ids = itertools.count()
        self.loads = LoadPlanner(blocks, self.links, planner, config.load_timeout_s, self._job_ids)
        self.counters: Counter[str] = Counter()
        self.commits = CommitPlanner(blocks, ns, self.links, planner, committer, self.counters)

    # -- requests ---------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request; refuse one that could never run (bad input, exit 2). It is
        admitted on what its prompt needs (``engine.request_limits``)."""
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
        while not self.blocks.grow(_owner(seq), num_tokens):
            victims = [s for s in self.running if s is not seq and s.seq_id not in scheduled]
            if not victims:
                return False
            self._preempt(victims[-1])
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.release(_owner(seq))
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_cached_blocks = 0
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
        keys = seq.block_keys(self.ns)
        cap = self.blocks.hit_cap(seq.num_tokens)
        hit = self.blocks.longest_prefix(keys, seq.num_tokens)
        revived = sum(1 for b in hit if b.ref_cnt == 0)  # free now, taken by open()
        free_after_hit = self.blocks.num_free - revived
        planner = self.planner
        if self.link.enabled and (len(hit) < cap or planner.needs_sliding_load(hit)):
            n_load = cap - len(hit)
            reserve = planner.reserve_blocks(len(hit))
            if n_load + reserve > free_after_hit:
                return None
            job = self.loads.start(seq, _owner(seq), _reserve(seq), keys, cap, hit, reserve)
            seq.status = SequenceStatus.LOADING
            self.loading[seq.seq_id] = (seq, job)
            self.loader.submit(job)
            return 0
        plan = planner.plan(seq.num_tokens, [planner.has_sliding(b) for b in hit])
        used = hit[: plan.hit_blocks]
        start = plan.replay_start_tokens
        chunk = min(seq.num_tokens - start, budget)
        need = (max(0, self.blocks.blocks_for(start + chunk) - len(used))
                + len(plan.replay_blocks))
        if need > self.blocks.num_free - sum(1 for b in used if b.ref_cnt == 0):
            return None
        self.blocks.open(_owner(seq), used, lookup_blocks=cap)
        self._note_hit(seq, "hbm", len(used))
        self._start_running(seq, plan, pool_blocks=len(used))
        if not self.blocks.grow(_owner(seq), start + chunk):
            raise EngineIntegrityError("pool lost free blocks during admission")
        return chunk

    def _note_hit(self, seq: Sequence, tier: str, first: int, count: int | None = None) -> None:
        """Hit tokens of a tier, counted over prompt positions only."""
        bt, p = self.blocks.block_tokens, seq.num_prompt_tokens
        start, end = (0, first) if count is None else (first, first + count)
        seq.stats.hit_tokens[tier] += max(0, min(end * bt, p) - min(start * bt, p))

    def _start_running(self, seq: Sequence, plan: ReplayPlan, pool_blocks: int) -> None:
        """Run ``seq`` from its plan's replay start. Its table holds the hit (the pool's
        ``pool_blocks`` first, then what the store filled) and maybe fresh blocks after it;
        a hit the plan shortened gives back the blocks past it."""
        owner = _owner(seq)
        table = self.blocks.table(owner)
        h = plan.hit_blocks
        if len(table) > h and table[h].key is not None:
            self.blocks.truncate(owner, h)  # indexed blocks past the hit: not ours to write
        shared = range(plan.replay_blocks.start, min(plan.replay_blocks.stop, pool_blocks))
        seq.copied_stored_layers = {i: table[i].stored_layers for i in shared}
        self.blocks.release(_reserve(seq))  # its blocks are the private copies' room
        if shared:
            self.copy_blocks(self.blocks.privatize(owner, shared.start, shared.stop))
        seq.plan = plan
        seq.num_computed_tokens = plan.replay_start_tokens
        seq.num_cached_blocks = h
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    # -- background completions -------------------------------------------------------
    def poll(self) -> None:
        """Take in finished loads and commits (a failed one is a miss), give up on late
        loads."""
        for job in self.loader.finished():
            if job.error is not None:  # a bug, not store trouble: still only a miss
                note_job_error("load", job.error, self.counters)
                job.store_blocks = job.loaded_blocks = 0
                job.tiers, job.sliding_loaded = (), ()
            entry = self.loading.pop(job.seq_id, None)
            if entry is None or job.cancelled:  # given up on earlier: just free its blocks
                self.loads.release(job)
                continue
            self._loaded(entry[0], job)
            self.loads.release(job)  # what it handed over is the request's now
        now = time.monotonic()
        for seq_id, (seq, job) in list(self.loading.items()):
            if now > job.deadline_s and not job.done.is_set():
                job.cancelled = True  # the loader stops; its blocks go when it reports
                del self.loading[seq_id]
                seq.stats.load_gave_up += 1
                self.counters["loads_given_up_total"] += 1
                hit = self.blocks.table(_owner(seq))
                plan = self.planner.plan(seq.num_tokens,
                                         [self.planner.has_sliding(b) for b in hit])
                self._note_hit(seq, "hbm", plan.hit_blocks)
                self._start_running(seq, plan, pool_blocks=len(hit))
        self.commits.poll()

    def _loaded(self, seq: Sequence, job: LoadJob) -> None:
        seq.stats.store_lookup_s += job.lookup_s
        seq.stats.store_load_s += job.load_s
        hit, flags = self.loads.land(_owner(seq), job, seq.token_ids)
        plan = self.planner.plan(seq.num_tokens, flags)
        self._note_hit(seq, "hbm", min(hit, plan.hit_blocks))
        for j, tier in enumerate(job.tiers[: max(0, plan.hit_blocks - hit)]):
            self._note_hit(seq, tier, hit + j, 1)
        self._start_running(seq, plan, pool_blocks=hit)

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
            full = self._cacheable_blocks(seq)
            if full > seq.num_cached_blocks:
                keys = seq.block_keys(self.ns)
                self.blocks.cache(_owner(seq), keys, seq.num_cached_blocks, full,
                                  self.planner.computed_layers, seq.token_ids)
                seq.num_cached_blocks = full
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a prefill chunk short of the end: no token yet
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

    def _cacheable_blocks(self, seq: Sequence) -> int:
        """Leading blocks of ``seq`` computed and allowed in the pool index and the store."""
        full = seq.num_computed_tokens // self.blocks.block_tokens
        if not self.config.cache_generated_tokens:
            full = min(full, seq.num_prompt_tokens // self.blocks.block_tokens)
        return full

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
            return
        if seq.status is SequenceStatus.LOADING:
            _, job = self.loading.pop(seq.seq_id)
            job.cancelled = True  # the loader stops; its blocks go when it reports
            self.blocks.release(_owner(seq))
            self.blocks.release(_reserve(seq))  # room set aside for a replay's copies
            seq.status = SequenceStatus.FINISHED
            return
        self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        owner = _owner(seq)
        self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        full = self._cacheable_blocks(seq)
        try:
            if self.link.enabled and full:
                self.commits.submit(seq, owner, full)
        except Exception as e:  # a commit is best-effort: its failure costs store misses
            note_job_error("commit", e, self.counters)
        finally:
            self.blocks.release(owner)

    def check_integrity(self) -> None:
        """The pool's accounting, and each sequence's blocks against its state."""
        self.blocks.check_integrity()
        bt = self.blocks.block_tokens
        for seq in self.waiting:
            if self.blocks.holds(_owner(seq)) or seq.status is not SequenceStatus.WAITING:
                raise EngineIntegrityError(f"waiting {seq} holds blocks or has another status")
        for seq, _job in self.loading.values():
            if seq.status is not SequenceStatus.LOADING or not self.blocks.holds(_owner(seq)):
                raise EngineIntegrityError(f"loading {seq} is not loading or holds nothing")
        for seq in self.running:
            if seq.status is not SequenceStatus.RUNNING:
                raise EngineIntegrityError(f"running list holds {seq}")
            table = self.blocks.table(_owner(seq))
            if len(table) * bt < seq.num_computed_tokens:
                raise EngineIntegrityError(f"{seq} computed past its {len(table)} blocks")
            known = max(seq.num_computed_tokens, seq.plan.hit_tokens if seq.plan else 0)
            if seq.num_cached_blocks > known // bt:
                raise EngineIntegrityError(f"{seq} indexed blocks it has not computed")
