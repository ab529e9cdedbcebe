"""``GET /metrics``: the server's Prometheus metrics, on a registry of its own.

- ``kvengine_time_to_first_token_seconds`` and ``kvengine_time_per_output_token_seconds``
  (histograms, from the HTTP request's arrival);
- ``kvengine_ttft_part_seconds{part}``: TTFT broken into ``queue`` (arrival to admission),
  ``store_lookup``, ``store_load`` and ``compute`` (the rest: prefill and first sample);
- ``kvengine_store_call_seconds{call}``: every store call (``lookup``, ``get``, ``commit``);
- ``kvengine_prompt_tokens_total{source}``: prompt tokens by where their KV came from,
  ``hbm`` (the pool), ``dram``, ``ssd``, or ``computed``; replayed hit tokens (bounded
  replay) are counted under ``computed`` and not under their tier;
- ``kvengine_generation_tokens_total``, ``kvengine_requests_total{finish_reason}``,
  ``kvengine_rejected_requests_total{reason}``;
- gauges read at scrape time: ``kvengine_requests_running``, ``kvengine_requests_waiting``
  (queued or loading from the store), ``kvengine_pool_blocks``, ``kvengine_pool_used_blocks``
  and ``kvengine_pool_usage_ratio``; ``kvengine_store_jobs_pending{job}``: store loads and
  commits submitted and not yet over (a finished request's commit runs after its response:
  at 0, every store call so far is in ``kvengine_store_call_seconds``);
- ``kvengine_kv_transfers_total{side,outcome}`` and
  ``kvengine_kv_transfer_wait_seconds{side}``: prefill/decode hand-offs (``--kv-role``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine.core.llm_engine import LLMEngine
from engine.core.sequence import TIERS, Sequence

#: (side, outcome) of ``kvengine_kv_transfers_total``: a prefill's commit is all visible
#: (``complete``) or not (``partial``: the decode recomputes the rest); a decode found every
#: block the prefill reported (``complete``), gave up waiting (``timeout``), or was told of
#: another namespace (``namespace_mismatch``: another model or tenant; nothing to wait for).
KV_TRANSFER_OUTCOMES = (("prefill", "complete"), ("prefill", "partial"),
                        ("decode", "complete"), ("decode", "timeout"),
                        ("decode", "namespace_mismatch"))
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)
_STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                  0.25, 0.5, 1, 5)


def cached_tokens(seq: Sequence) -> int:
    """Prompt tokens served from a cache: hits minus the tokens of the hit replayed."""
    s = seq.stats
    return max(0, sum(s.hit_tokens.values()) - s.replayed_tokens)


def replayed_tokens(seq: Sequence) -> int:
    """Prompt tokens of a cache hit recomputed by a bounded replay: 0 when exact mode (or a
    pool hit holding every layer) served the request, ``keep`` when bounded replay did."""
    return seq.stats.replayed_tokens


def ttft_parts(seq: Sequence, arrival_s: float) -> dict[str, float]:
    """The request's TTFT split: ``queue_s`` (arrival to admission), ``store_lookup_s``,
    ``store_load_s`` and ``compute_s`` (the rest: prefill and the first sample)."""
    s = seq.stats
    first = s.first_token_s if s.first_token_s is not None else arrival_s
    ttft = first - arrival_s
    queue = max(0.0, (s.admitted_s or first) - arrival_s)
    return {"queue_s": queue, "store_lookup_s": s.store_lookup_s,
            "store_load_s": s.store_load_s,
            "compute_s": max(0.0, ttft - queue - s.store_lookup_s - s.store_load_s)}


class ServerMetrics:
    def __init__(self, engine: LLMEngine) -> None:
        self.registry = r = CollectorRegistry()
        self.ttft = Histogram("kvengine_time_to_first_token_seconds",
                              "Time from the request's arrival to its first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("kvengine_time_per_output_token_seconds",
                              "Time per output token after the first",
                              buckets=_STORE_BUCKETS, registry=r)
        self.ttft_part = Histogram("kvengine_ttft_part_seconds",
                                   "TTFT broken into queue, store lookup, store load, compute",
                                   ["part"], buckets=_LATENCY_BUCKETS, registry=r)
        self.store_call = Histogram("kvengine_store_call_seconds", "Store call latency",
                                    ["call"], buckets=_STORE_BUCKETS, registry=r)
        self.prompt_tokens = Counter("kvengine_prompt_tokens",
                                     "Prompt tokens by the source of their KV", ["source"],
                                     registry=r)
        self.generation_tokens = Counter("kvengine_generation_tokens",
                                         "Output tokens generated", registry=r)
        self.requests = Counter("kvengine_requests", "Requests ended, by finish reason",
                                ["finish_reason"], registry=r)
        self.rejected = Counter("kvengine_rejected_requests",
                                "Requests refused before the engine saw them", ["reason"],
                                registry=r)
        for source in (*TIERS, "computed"):
            self.prompt_tokens.labels(source)
        # Prefill/decode hand-offs (engine.server.kv_transfer): how each side's wait ended.
        self.kv_transfers = Counter("kvengine_kv_transfers",
                                    "Prefill/decode hand-offs through the store, by side and "
                                    "outcome", ["side", "outcome"], registry=r)
        self.kv_transfer_wait = Histogram("kvengine_kv_transfer_wait_seconds",
                                          "Time a hand-off waited for the store", ["side"],
                                          buckets=_LATENCY_BUCKETS, registry=r)
        for side, outcome in KV_TRANSFER_OUTCOMES:
            self.kv_transfers.labels(side, outcome)
        sched, blocks = engine.scheduler, engine.blocks
        Gauge("kvengine_requests_running", "Requests admitted and computing",
              registry=r).set_function(lambda: len(sched.running))
        Gauge("kvengine_requests_waiting", "Requests queued or loading from the store",
              registry=r).set_function(lambda: len(sched.waiting) + len(sched.loading))
        total = blocks.pool.num_blocks
        Gauge("kvengine_pool_blocks", "KV pool size in blocks", registry=r).set(total)
        Gauge("kvengine_pool_used_blocks", "Pool blocks held by requests or copies",
              registry=r).set_function(lambda: total - blocks.num_free)
        Gauge("kvengine_pool_usage_ratio", "Share of the pool held",
              registry=r).set_function(lambda: (total - blocks.num_free) / total)
        pending = Gauge("kvengine_store_jobs_pending",
                        "Store loads and commits submitted and not yet over", ["job"],
                        registry=r)
        pending.labels("load").set_function(lambda: engine.loader.unfinished)
        pending.labels("commit").set_function(lambda: engine.committer.unfinished)

    def observe_store_call(self, call: str, seconds: float) -> None:
        self.store_call.labels(call).observe(seconds)

    def observe_finished(self, seq: Sequence, arrival_s: float) -> None:
        """A request ended (any reason); ``arrival_s`` is its HTTP arrival
        (``time.perf_counter``)."""
        s = seq.stats
        self.requests.labels(seq.finish_reason or "unknown").inc()
        out = len(seq.output_ids)
        self.generation_tokens.inc(out)
        if s.first_token_s is None:
            return  # aborted before its first token: no latency to report
        cached = cached_tokens(seq)
        replayed = sum(s.hit_tokens.values()) - cached
        for tier in TIERS:
            share = s.hit_tokens[tier]
            take = min(share, replayed)  # replayed tokens come off the hit's own tiers
            replayed -= take
            self.prompt_tokens.labels(tier).inc(share - take)
        self.prompt_tokens.labels("computed").inc(seq.num_prompt_tokens - cached)
        self.ttft.observe(s.first_token_s - arrival_s)
        for part, seconds in ttft_parts(seq, arrival_s).items():
            self.ttft_part.labels(part.removesuffix("_s")).observe(seconds)
        if out > 1 and s.last_token_s is not None:
            self.tpot.observe((s.last_token_s - s.first_token_s) / (out - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
