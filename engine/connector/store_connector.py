"""The store connector: the one object between the engine and its KV store.

As vLLM v1 keeps its KV connector apart from the KV cache manager, this owns the store
links (the primary namespace's, and for a hybrid model the sliding layers': every block's in
exact mode, the window tails of committed ends in bounded mode),
the background loader and committer, and their planners (``engine.connector.load_planner``,
``engine.connector.commit_planner``), behind four calls the scheduler makes:

- ``match(seq, hit)``: after the pool's hit, whether the store is asked for more, and how
  many free blocks the load needs (``LoadNeed``; None: run from the pool's hit);
- ``start_load(seq, hit, need)``: open the request's table, take the blocks, submit the job;
- ``poll(landed)``: take in finished loads and commits; each load that landed (or whose
  deadline passed: it recomputes) is passed to ``landed`` as a ``LoadOutcome``, and the
  job's leftover blocks are released once ``landed`` returned;
- ``on_prefilled(seq)``: a request's prompt is computed (its first token is sampled): the
  prompt's full blocks the store lacks are copied out and committed in the background at
  once, not when the request ends, so a session's next turn finds them in the store even
  when it lands on another replica (``seq.prefill_commit`` says when they are in);
- ``on_finish(seq)``: a request ended: its blocks the store lacks past those its prefill
  sent are copied out and committed in the background.

Commits are best-effort: a failure is counted, never raised, and under back-pressure a
commit is cut short or dropped (counted), never waited for.

What a block holds and who holds it is the KV manager's (``engine.kv.kv_manager``); a
store's trouble is a miss (``engine.connector.store_link``). ``counters`` are the engine's
request counters (the scheduler counts in them too).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import kernels
from engine.connector.commit_planner import CommitPlanner
from engine.connector.committer import KVCommitter
from engine.connector.handoff import CommitReceipt, PrefillCommit
from engine.connector.load_planner import LoadPlanner
from engine.connector.loader import KVLoader, LoadJob
from engine.connector.store_link import StoreLink
from engine.connector.transfer import note_job_error
from engine.core.config import EngineConfig
from engine.core.sequence import Sequence
from engine.kv.cache import KVCache
from engine.kv.kv_manager import KVManager, PrefixMatch


@dataclass(frozen=True, slots=True)
class LoadNeed:
    """What a store load takes from the pool at admission."""

    load_blocks: int  # blocks the store's part of the hit lands in
    reserve_blocks: int  # room for the private copies a replay of the pool's hit needs

    @property
    def blocks(self) -> int:
        return self.load_blocks + self.reserve_blocks


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """A load the request waited for is over: its table holds the hit."""

    seq: Sequence
    pool_blocks: int  # of the table, blocks that were the pool's hit
    has_sliding: tuple[bool, ...]  # per block of the hit: holds the sliding layers
    tiers: tuple[str, ...]  # the tier that served each block after the pool's
    gave_up: bool  # its deadline passed first: only the pool's hit counts


class StoreConnector:
    def __init__(
        self,
        link: StoreLink,
        sliding_link: StoreLink | None,
        kv: KVManager,
        cache: KVCache,
        backend: str | kernels.AttentionBackend | None,
        config: EngineConfig,
        progress: threading.Event,
    ) -> None:
        """``sliding_link``: a hybrid model's sliding layers' namespace.
        ``progress`` is set whenever a transfer finishes (the engine waits on it)."""
        self.link = link
        self.sliding_link = sliding_link
        self.links = (link,) if sliding_link is None else (link, sliding_link)
        self.kv = kv
        self.counters: Counter[str] = Counter()
        layers = link.ns.cached_layers  # the primary namespace's; a job may name another
        self.loader = KVLoader(
            link, cache, layers, backend, progress, config.store_call_timeout_s,
            sliding_link=sliding_link, window_first_block=kv.planner.window_first_block,
        )
        self.committer = KVCommitter(
            link, cache, layers, backend, progress, config.commit_timeout_s,
            staging_bytes=config.commit_staging_bytes,
        )
        self.loads = LoadPlanner(kv, self.links, config.load_timeout_s)
        self.commits = CommitPlanner(kv, self.links, self.committer, self.counters)
        if sliding_link is not None and kv.planner.commits_leaving_rows:
            kv.window_listener = self.commits  # sliding rows leaving the window: commit
        # By seq_id: the loads requests wait for. A job given up on leaves at once; the
        # loader still reports it later, and only its blocks are released then.
        self._jobs: dict[int, tuple[Sequence, LoadJob]] = {}

    @property
    def enabled(self) -> bool:
        return self.link.enabled

    # -- loads ------------------------------------------------------------------------
    def match(self, seq: Sequence, hit: PrefixMatch) -> LoadNeed | None:
        """Whether ``seq`` asks the store for more than the pool's ``hit``: blocks short
        of the cap, or a last window lacking the sliding layers (exact mode needs them,
        bounded mode skips its replay with a tail)."""
        planner = self.kv.planner
        sliding = self.sliding_link is not None and self.sliding_link.enabled
        wanted = len(hit.blocks) < hit.cap_blocks or (
            sliding and planner.needs_sliding_load(hit.blocks))
        if not (self.link.enabled and wanted):
            return None
        return LoadNeed(hit.cap_blocks - len(hit.blocks),
                        planner.reserve_blocks(len(hit.blocks)))

    def start_load(self, seq: Sequence, hit: PrefixMatch, need: LoadNeed) -> None:
        """Start ``seq``'s load (the caller checked ``need.blocks`` are free)."""
        job = self.loads.start(seq, hit, need.reserve_blocks)
        self._jobs[seq.seq_id] = (seq, job)
        self.loader.submit(job)

    def abort_load(self, seq: Sequence) -> None:
        """``seq`` stops waiting: the loader stops, its blocks go when it reports."""
        self._jobs.pop(seq.seq_id)[1].cancelled = True

    @property
    def loading_ids(self) -> frozenset[int]:
        """The requests whose load is in flight (seq_ids)."""
        return frozenset(self._jobs)

    def poll(self, landed: Callable[[LoadOutcome], None]) -> None:
        """Take in finished loads (a failed one is a miss) and commits, give up on late
        loads; ``landed`` starts each request whose load is over."""
        for job in self.loader.finished():
            if job.error is not None:  # a bug, not store trouble: still only a miss
                note_job_error("load", job.error, self.counters)
                job.store_blocks = job.loaded_blocks = 0
                job.tiers, job.sliding_loaded = (), ()
            entry = self._jobs.get(job.seq_id)
            if entry is None or entry[1] is not job or job.cancelled:
                self.loads.release(job)  # given up on earlier: just free its blocks
                continue
            del self._jobs[job.seq_id]
            seq = entry[0]
            seq.stats.store_lookup_s += job.lookup_s
            seq.stats.store_load_s += job.load_s
            pool_blocks, flags = self.loads.land(seq, job)
            landed(LoadOutcome(seq, pool_blocks, tuple(flags), job.tiers, gave_up=False))
            self.loads.release(job)  # what it handed over is the request's now
        now = time.monotonic()
        for seq_id, (seq, job) in list(self._jobs.items()):
            if now > job.deadline_s and not job.done.is_set():
                job.cancelled = True  # the loader stops; its blocks go when it reports
                del self._jobs[seq_id]
                seq.stats.load_gave_up += 1
                self.counters["loads_given_up_total"] += 1
                table = self.kv.table(seq)
                landed(LoadOutcome(seq, len(table), tuple(self.kv.has_sliding(table)), (),
                                   gave_up=True))
        self.commits.poll()

    # -- commits ----------------------------------------------------------------------
    def on_prefilled(self, seq: Sequence) -> None:
        """``seq``'s prompt is computed: commit its full blocks the store lacks now (once a
        request; a request preempted after it does not send them again)."""
        if seq.prefill_commit is not None or not self.link.enabled:
            return
        receipt = CommitReceipt()
        seq.prefill_commit = PrefillCommit(receipt, 0)
        try:
            full = min(self.kv.cacheable_blocks(seq),
                       seq.num_prompt_tokens // self.kv.block_tokens)
            if full:
                seq.prefill_commit.blocks = self.commits.submit(seq, full,
                                                                receipts=(receipt,))
        except Exception as e:
            note_job_error("commit", e, self.counters)
        finally:
            receipt.seal()

    def on_finish(self, seq: Sequence) -> None:
        """``seq`` ended still holding its table: commit what the store lacks past what its
        prefill sent (nothing, when that is all: its prefill's commit refreshed the
        recency a moment ago). Best-effort: a failure costs store misses and is counted,
        never raised."""
        full = self.kv.cacheable_blocks(seq)
        start = 0 if seq.prefill_commit is None else seq.prefill_commit.blocks
        try:
            if self.link.enabled and full > start:
                self.commits.submit(seq, full, start)
        except Exception as e:
            note_job_error("commit", e, self.counters)

    # -- the links --------------------------------------------------------------------
    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted commit has reached the store."""
        return self.committer.wait_idle(timeout_s)

    def store_counters(self) -> dict[str, int]:
        """The store links' counters, summed over the namespaces."""
        out: dict[str, int] = {}
        for link in self.links:
            for k, v in link.counters().items():
                out[k] = out.get(k, 0) + v
        return out

    def check_integrity(self) -> None:
        self.committer.staging.check_integrity()

    def close(self) -> None:
        """Stop the threads and close the links (the store flushes what it accepted)."""
        self.loader.close()
        self.committer.close()
        if self.sliding_link is not None:
            self.sliding_link.close()
        self.link.close()
