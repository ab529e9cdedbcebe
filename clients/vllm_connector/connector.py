"""``KVStoreConnector``: the store behind vLLM through its KV-connector API (v1).

Load it with ``--kv-transfer-config '{"kv_connector":"KVStoreConnector",
"kv_connector_module_path":"clients.vllm_connector.connector","kv_role":"kv_both",
"kv_connector_extra_config":{"store":"embedded:DIR"|"grpc://HOST:PORT"}}'``
(clients/vllm_connector/README.md). This module imports vLLM: only vLLM's venv loads it.

Scheduler side: a request's prompt is looked up by the store's chain keys (DESIGN §3) in the
namespace ``kvengine`` computes for the checkpoint; a hit beyond what vLLM's own prefix cache
has is loaded asynchronously (the request waits, others run). Worker side: a load copies
the store blocks into vLLM's paged KV in a background thread (``layout``: block sizes and
the kernel's packing converted); every full block a step computed that the store lacks is
copied out right after that step's forward and committed in the background, so vLLM never
holds a block for the store. A load that fails, times out or meets a corrupt block is
reported through ``get_block_ids_with_load_errors`` and vLLM recomputes (the connector sets
``kv_load_failure_policy="recompute"``): store trouble costs misses, never a wrong token.
"""

from __future__ import annotations

import logging
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from clients.vllm_connector import links
from clients.vllm_connector.config import ConnectorConfig, ConnectorConfigError
from clients.vllm_connector.handoff import ConsumerWaits, commit_timeout_s, prefill_params
from clients.vllm_connector.layout import (
    LayoutError,
    PagedLayout,
    cpu_cache_writer,
    probe_layout,
    read_tokens,
    token_slots,
)
from clients.vllm_connector.namespace import (
    base_namespace,
    checkpoint_model_spec,
    request_namespace,
)
from clients.vllm_connector.plan import (
    ConnectorMeta,
    LoadJob,
    RequestState,
    SaveJob,
    usable_hit_tokens,
)
from clients.vllm_connector.stats import KVStoreConnectorStats, StatCounters, store_errors
from kvstore.keys import chain_keys

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under vLLM's logger: its handler and VLLM_LOGGING_LEVEL (DEBUG shows every decision).
log = logging.getLogger("vllm.kvstore")
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


class KVStoreConnectorMetadata(KVConnectorMetadata):
    def __init__(self, meta: ConnectorMeta) -> None:
        self.meta = meta


class KVStoreConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role,
                         kv_cache_config=kv_cache_config)  # type: ignore[arg-type]
        self._cfg = ConnectorConfig.from_extra(self._kv_transfer_config.kv_connector_extra_config)
        _check_deployment(vllm_config, self._cfg)
        self._vllm_block = vllm_config.cache_config.block_size
        self._block_tokens = self._cfg.block_tokens
        spec = checkpoint_model_spec(str(vllm_config.model_config.model),
                                     vllm_config.model_config.dtype)
        self._spec = spec
        if role == KVConnectorRole.SCHEDULER:
            # The scheduler reads the policy after building its connector: store trouble
            # must cost recomputation, never a failed request.
            self._kv_transfer_config.kv_load_failure_policy = "recompute"
        self._link = links.acquire(
            self._cfg,
            lambda tenant: base_namespace(
                spec, self._block_tokens, tenant, self._cfg.prefix_hash
            ),
        )
        self._base_ns = self._link.ns
        self._closed = False
        # scheduler side
        self._reqs: dict[str, RequestState] = {}
        self._requests: dict[str, Request] = {}
        self._pending_loads: list[LoadJob] = []
        self._remote = ConsumerWaits(self._cfg.kv_transfer_timeout_s)  # PD consumers
        # worker side
        self._layers: list[torch.Tensor] = []
        self._layout: PagedLayout | None = None
        self._write: Any = None  # vLLM's cache-write op (loads go through it, as its forward)
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="kvstore-load")
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="kvstore-commit")
        self._loading: dict[str, tuple[LoadJob, Future[int]]] = {}
        self._commits: list[Future[Any]] = []
        self._load_errors: set[int] = set()
        self._stats = StatCounters()

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        prompt = request.prompt_token_ids
        if not prompt:
            return 0, False
        state = self._reqs.get(request.request_id)
        if state is None:
            ns = request_namespace(self._base_ns, getattr(request, "cache_salt", None))
            keys = chain_keys(ns, prompt) if len(prompt) >= self._block_tokens else []
            hit = self._link.lookup(keys, self._cfg.call_timeout_s, ns=ns).hit_blocks
            log.debug("KVStoreConnector: %s: the store holds %d of the prompt's %d blocks",
                      request.request_id, hit, len(keys))
            if self._remote.waiting(request.request_id,
                                    getattr(request, "kv_transfer_params", None), ns, hit,
                                    len(keys)):
                return None, False  # the producer's blocks are not there yet: ask later
            state = RequestState(ns=ns, keys=keys, stored_blocks=hit, hit_blocks=hit)
            self._reqs[request.request_id] = state
            self._requests[request.request_id] = request
        usable = usable_hit_tokens(state.hit_blocks, self._block_tokens, len(prompt),
                                   self._vllm_block)
        if usable <= num_computed_tokens or state.load_issued:
            state.load = None
            return 0, False
        state.load = (num_computed_tokens, usable)
        log.debug("KVStoreConnector: %s: offering tokens %d..%d", request.request_id,
                  num_computed_tokens, usable)
        return usable - num_computed_tokens, True

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        state = self._reqs.get(request.request_id)
        if num_external_tokens <= 0 or state is None or state.load is None:
            return
        start, end = state.load
        state.load = None  # a second call (after the load) allocates, never loads again
        state.load_issued = True
        first = start // self._block_tokens
        last = -(-end // self._block_tokens)
        self._pending_loads.append(LoadJob(
            req_id=request.request_id, ns=state.ns, keys=tuple(state.keys[first:last]),
            first_block=first, start=start, end=end,
            block_ids=tuple(blocks.get_block_ids()[0]),
            timeout_s=self._remote.load_timeout_s(request.request_id, self._cfg.call_timeout_s),
        ))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = ConnectorMeta(loads=self._pending_loads)
        self._pending_loads = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._reqs.get(new.req_id)
            if state is not None:
                # A load that failed in part was recomputed from here: the store lacks it.
                state.stored_blocks = min(state.stored_blocks,
                                          new.num_computed_tokens // self._block_tokens)
            self._plan_save(meta, new.req_id, new.num_computed_tokens + scheduled[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            self._plan_save(meta, req_id, cached.num_computed_tokens[i] + scheduled[req_id])
        return KVStoreConnectorMetadata(meta)

    def _plan_save(self, meta: ConnectorMeta, req_id: str, computed_end: int) -> None:
        state = self._reqs.get(req_id)
        request = self._requests.get(req_id)
        if state is None or request is None or self._kv_cache_manager is None:
            return
        span = state.save_range(computed_end, self._block_tokens)
        if span is None:
            return
        first, last = span
        if last <= len(state.keys):
            keys = state.keys[:last]
        else:  # blocks of generated tokens: their chain continues the prompt's
            tokens = list(request.all_token_ids[: last * self._block_tokens])
            keys = chain_keys(state.ns, tokens)
        block_ids = self._kv_cache_manager.get_block_ids(req_id)[0]
        timeout_s = commit_timeout_s(getattr(request, "kv_transfer_params", None),
                                     self._cfg.call_timeout_s, self._cfg.kv_transfer_timeout_s)
        meta.saves.append(SaveJob(req_id=req_id, ns=state.ns, keys=tuple(keys),
                                  first_block=first, block_ids=tuple(block_ids),
                                  timeout_s=timeout_s))
        state.stored_blocks = last

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        # Every full block was copied out in the step that computed it: nothing to hold.
        state = self._reqs.pop(request.request_id, None)
        self._requests.pop(request.request_id, None)
        self._remote.forget(request.request_id)
        ns = state.ns if state is not None else request_namespace(
            self._base_ns, getattr(request, "cache_salt", None))
        return False, prefill_params(getattr(request, "kv_transfer_params", None),
                                     len(request.prompt_token_ids or ()), self._block_tokens,
                                     ns)

    # ------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        ordered = sorted(kv_caches.items(), key=lambda kv: _layer_index(kv[0]))
        layers = [t for _, t in ordered]
        spec = self._spec
        try:
            if len(layers) != spec.num_layers:
                raise LayoutError(f"vLLM has {len(layers)} KV layers, the checkpoint "
                                  f"{spec.num_layers}")
            first = layers[0]
            if first.dtype != spec.dtype:
                raise LayoutError(f"vLLM's KV dtype {first.dtype} is not the model's "
                                  f"{spec.dtype}")
            write = cpu_cache_writer(first.dtype, first.shape[2], spec.head_dim)
            layout = probe_layout(write, first.shape[2], spec.num_kv_heads, spec.head_dim,
                                  first.dtype)
            for t in layers:
                layout.check_layer(t)
        except LayoutError as e:
            log.warning("KVStoreConnector: %s; every store block is a miss", e)
            return
        self._layers, self._layout, self._write = layers, layout, write

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._meta()
        for job in meta.loads if meta is not None else ():
            self._loading[job.req_id] = (job, self._loader.submit(self._load, job))

    def _load(self, job: LoadJob) -> int:
        """Copy what the store holds of ``job`` into vLLM's blocks; returns the token the
        copied prefix ends at (``job.start`` when nothing came)."""
        B = self._block_tokens
        if self._write is None or not job.keys:
            return job.start
        try:
            rows = torch.empty((len(job.keys), *job.ns.payload_shape), dtype=self._spec.dtype)
            start_s = time.monotonic()
            got = self._link.get_into(list(job.keys), rows, job.timeout_s, ns=job.ns)
            took_s = time.monotonic() - start_s
            if got < len(job.keys):  # the lookup found them: say why vLLM recomputes
                log.info("KVStoreConnector: load of %s brought %d of %d blocks in %.2f s "
                         "(store errors so far: %s); vLLM recomputes the rest", job.req_id,
                         got, len(job.keys), took_s, store_errors(self._link.counters()))
            else:
                log.debug("KVStoreConnector: load of %s: %d blocks in %.2f s", job.req_id,
                          got, took_s)
            end = min(job.end, (job.first_block + got) * B)
            if end <= job.start:
                return job.start
            block_ids, offsets = token_slots(list(job.block_ids), job.start, end,
                                             self._vllm_block)
            slots = block_ids * self._vllm_block + offsets
            lo, hi = job.start - job.first_block * B, end - job.first_block * B
            heads, dim = self._spec.num_kv_heads, self._spec.head_dim
            for i, layer in enumerate(self._layers):
                # vLLM's own cache-write kernel: the layout its attention reads, at its speed
                # (the measured permutation serves the copy out, which has no such kernel).
                tokens = rows[:got, i].transpose(0, 1).reshape(2, got * B, heads, dim)
                self._write(tokens[0, lo:hi].contiguous(), tokens[1, lo:hi].contiguous(),
                            layer, slots)
            self._stats.add(loaded_blocks=got, loaded_tokens=end - job.start)
            return end
        except Exception as e:  # a bug here must cost a recomputation, not the server
            log.warning("KVStoreConnector: load of %s failed (%s: %s); recomputing",
                        job.req_id, type(e).__name__, e)
            return job.start

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads end before their request is scheduled (asynchronous loading)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # whole blocks are copied out once per step, in wait_for_save

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is None or self._layout is None:
            return
        for job in meta.saves:
            rows = self._copy_out(job, self._layout)
            self._commits.append(self._committer.submit(self._commit, job, rows))
        self._commits = [f for f in self._commits if not f.done()]

    def _copy_out(self, job: SaveJob, layout: PagedLayout) -> torch.Tensor:
        """The blocks ``job`` saves, as store rows, from vLLM's blocks (before the step
        ends: after it the scheduler may reuse them)."""
        B = self._block_tokens
        n = len(job.keys) - job.first_block
        heads, dim = self._spec.num_kv_heads, self._spec.head_dim
        rows = torch.empty((n, len(self._layers), 2, B, heads, dim), dtype=self._spec.dtype)
        block_ids, offsets = token_slots(list(job.block_ids), job.first_block * B,
                                         len(job.keys) * B, self._vllm_block)
        index = layout.flat_index(block_ids, offsets)
        for i, layer in enumerate(self._layers):
            rows[:, i] = read_tokens(layer, index).view(2, n, B, heads, dim).transpose(0, 1)
        return rows

    def _commit(self, job: SaveJob, rows: torch.Tensor) -> None:
        payloads = {job.first_block + i: rows[i] for i in range(rows.shape[0])}
        start_s = time.monotonic()
        res = self._link.commit(list(job.keys), payloads, job.timeout_s, ns=job.ns)
        took_s = time.monotonic() - start_s
        self._stats.add(saved_blocks=res.inserted, save_dropped_blocks=res.dropped)
        if res.dropped:
            log.info("KVStoreConnector: %s: the store dropped %d of %d blocks in %.2f s "
                     "(store errors so far: %s)", job.req_id, res.dropped, len(payloads),
                     took_s, store_errors(self._link.counters()))
        else:
            log.debug("KVStoreConnector: %s: committed blocks %d..%d in %.2f s (%d new)",
                      job.req_id, job.first_block, len(job.keys), took_s, res.inserted)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                set[str] | None]:
        done: set[str] = set()
        for req_id, (job, fut) in list(self._loading.items()):
            if not fut.done():
                continue
            del self._loading[req_id]
            done.add(req_id)
            failed = job.failed_block_ids(fut.result(), self._vllm_block)
            if failed:
                self._stats.add(load_failed_blocks=len(failed))
            self._load_errors |= failed
        return None, done or None

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every block copied out so far has reached the store (or failed)."""
        futures_wait(list(self._commits), timeout=timeout_s)

    def totals(self) -> dict[str, int]:
        """This worker's counters since it started (tests and benchmarks read them)."""
        return self._stats.totals()

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def get_kv_connector_stats(self) -> KVStoreConnectorStats | None:
        data = self._stats.take()
        return KVStoreConnectorStats(data=data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVStoreConnectorStats | None:
        return KVStoreConnectorStats(data=dict(data or {}))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loader.shutdown(wait=True)
        self._committer.shutdown(wait=True)  # what was copied out reaches the store
        links.release(self._cfg)

    def _meta(self) -> ConnectorMeta | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta.meta if isinstance(meta, KVStoreConnectorMetadata) else None


def _layer_index(name: str) -> int:
    m = _LAYER_INDEX.search(name)
    return int(m.group(1)) if m else -1


def _check_deployment(vllm_config: VllmConfig, cfg: ConnectorConfig) -> None:
    """Refuse, with one line, what the connector cannot serve at all."""
    if vllm_config.cache_config.cache_dtype != "auto":
        raise ConnectorConfigError(
            f"KVStoreConnector: kv_cache_dtype {vllm_config.cache_config.cache_dtype!r} is not "
            "supported; the store keeps KV in the model's dtype (leave it 'auto')"
        )
    parallel = vllm_config.parallel_config
    if parallel.tensor_parallel_size != 1 or parallel.pipeline_parallel_size != 1:
        raise ConnectorConfigError("KVStoreConnector: tensor and pipeline parallel size must "
                                   "be 1")
    if cfg.is_embedded and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1":
        # On CPU vLLM runs its scheduler and its worker in two processes unless told not
        # to; an embedded store's directory can be opened by one process only.
        raise ConnectorConfigError(
            "KVStoreConnector: store embedded:DIR needs vLLM in one process (set "
            "VLLM_ENABLE_V1_MULTIPROCESSING=0), or serve DIR with `kvstore serve` and use "
            "grpc://HOST:PORT"
        )
