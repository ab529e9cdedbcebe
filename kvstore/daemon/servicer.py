"""The ``KVStore`` gRPC service over any ``KVStore`` implementation (DESIGN §7).

Every RPC authenticates first, then checks that the caller's tenant owns the namespace
it names, then validates the whole request before touching the store, so a refused or
malformed request has no side effects. ``Commit`` buffers the blocks of one request,
verifies each one's header and checksum as it completes, and commits once: a malformed
chunk aborts the request with nothing stored, while a stream that ends early (the
client went away, or sat idle past the deadline and was cancelled) commits the
complete, verified blocks before the break and nothing else (DESIGN §7). The buffers a
call needs (gRPC-path payloads, staged rows copied out) come out of one daemon-wide byte
budget (``ByteBudget``). The calls that are not about one namespace (Stats, Flush,
WhoAmI, DeleteTenant, staging) are in ``ControlRpcs``.

Checksums end to end (DESIGN §4): what the daemon sends with a block is the checksum
stored with it since its commit, never one computed from its own memory, so a byte
damaged here fails at the client. Staged rows are copied out of the client-writable
segment before they are checked and committed, so what is checked is what is stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from kvstore.accesslog.writer import AccessLog, LookupRecord
from kvstore.block import now_us
from kvstore.daemon.budget import ByteBudget, row_buffer
from kvstore.daemon.catalog import MemoryCatalog
from kvstore.daemon.control_rpcs import ControlRpcs
from kvstore.daemon.metrics import DaemonMetrics
from kvstore.daemon.staging import StagingArea
from kvstore.daemon.tenants import TenantLedger
from kvstore.daemon.watchdog import IdleWatchdog
from kvstore.errors import BlockError, InvalidArgument
from kvstore.keys import Key, Namespace
from kvstore.rpcserver.auth import Authenticator
from kvstore.rpcserver.limits import ServerLimits
from kvstore.tier import KVStore
from kvstore.wire import codec
from kvstore.wire.codec import MAX_PROMPT_TOKENS
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class KVStoreServicer(ControlRpcs, pb_grpc.KVStoreServicer):
    metrics: DaemonMetrics  # the server runner's, plus the daemon's lookup counters

    def __init__(
        self,
        store: KVStore,
        auth: Authenticator,
        access_log: AccessLog,
        metrics: DaemonMetrics,
        staging: StagingArea | None,
        limits: ServerLimits | None = None,
        catalog: MemoryCatalog | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` (monotonic seconds) times the streams' idle deadline (tests inject
        one: see ``IdleWatchdog``)."""
        self.store = store
        self.auth = auth
        self.access_log = access_log
        self.metrics = metrics
        self.staging = staging
        self.limits = limits if limits is not None else ServerLimits()
        self.catalog = catalog if catalog is not None else MemoryCatalog()
        self.ledger = TenantLedger()
        self.budget = ByteBudget(self.limits.max_inflight_bytes)
        self.watchdog = IdleWatchdog(self.limits.stream_idle_timeout_s, clock=clock)

    def close(self) -> None:
        self.watchdog.close()
        self.catalog.close()

    def check_integrity(self) -> None:
        self.ledger.check_integrity()
        self.budget.check_integrity()
        self.watchdog.check_integrity()
        self.catalog.check_integrity()

    # -- plumbing -------------------------------------------------------------------
    def _ns(self, tenant: str | None, spec: pb.NamespaceSpec) -> Namespace:
        ns = codec.ns_from_proto(spec)
        self.auth.check_namespace(tenant, ns)
        return ns

    def _keys(self, keys: Any) -> list[Key]:
        if len(keys) > self.limits.max_keys_per_request:
            raise InvalidArgument(
                f"{len(keys)} keys exceed the limit of {self.limits.max_keys_per_request}"
            )
        return codec.check_keys(keys)

    def _rows_bytes(self, ns: Namespace, n: int) -> int:
        nbytes = n * ns.block_bytes
        if nbytes > self.limits.max_request_bytes:
            raise InvalidArgument(
                f"request of {nbytes} payload bytes exceeds the limit of "
                f"{self.limits.max_request_bytes}"
            )
        return nbytes

    def _staged_rows(self, tenant: str | None, ref: pb.StagingRef, nbytes: int) -> memoryview:
        if self.staging is None:
            raise InvalidArgument("this daemon offers no shared-memory staging")
        return self.staging.rows(tenant, ref.staging_id, ref.offset, nbytes)

    @staticmethod
    def _timeout(ctx: grpc.ServicerContext) -> float | None:
        return ctx.time_remaining()

    # -- RPCs -----------------------------------------------------------------------
    def RegisterNamespace(self, req: pb.RegisterNamespaceRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.RegisterNamespaceResponse:
            ns = self._ns(tenant, req.ns)
            self.store.register(ns, timeout_s=self._timeout(ctx))
            self.catalog.add(ns)
            return pb.RegisterNamespaceResponse(block_bytes=ns.block_bytes)

        return self._unary(ctx, "RegisterNamespace", run)

    def DeleteNamespace(self, req: pb.DeleteNamespaceRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.DeleteNamespaceResponse:
            ns = self._ns(tenant, req.ns)
            n = self.store.delete_namespace(ns, timeout_s=self._timeout(ctx))
            return pb.DeleteNamespaceResponse(deleted_blocks=n)

        return self._unary(ctx, "DeleteNamespace", run)

    def Lookup(self, req: pb.LookupRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.LookupResponse:
            ns = self._ns(tenant, req.ns)
            keys = self._keys(req.keys)
            if req.prompt_tokens > MAX_PROMPT_TOKENS:
                raise InvalidArgument(f"prompt_tokens must be < 2**63, got {req.prompt_tokens}")
            res = self.store.lookup(ns, keys, timeout_s=self._timeout(ctx))
            tiers = tuple(res.tiers)
            self.metrics.record_lookup(ns.block_bytes, ns.block_tokens, len(keys), tiers)
            self.ledger.count(
                ns.tenant,
                lookups_total=1,
                lookup_blocks_total=len(keys),
                lookup_hit_blocks_total=res.hit_blocks,
            )
            self.access_log.record(
                LookupRecord(
                    ts_us=now_us(),
                    tenant=ns.tenant,
                    namespace=ns.fingerprint,
                    block_tokens=ns.block_tokens,
                    prompt_tokens=req.prompt_tokens,
                    keys=keys,
                    hit_blocks=res.hit_blocks,
                    hit_hbm=tiers.count("hbm"),
                    hit_dram=tiers.count("dram"),
                    hit_ssd=tiers.count("ssd"),
                )
            )
            return pb.LookupResponse(hit_blocks=res.hit_blocks, tiers=tiers)

        return self._unary(ctx, "Lookup", run)

    def Get(self, req: pb.GetRequest, ctx: grpc.ServicerContext) -> Iterator[pb.GetResponse]:
        with self.metrics.timed("Get"):
            tenant = self._tenant(ctx, "Get")
            try:
                ns = self._ns(tenant, req.ns)
                keys = self._keys(req.keys)
                nbytes = self._rows_bytes(ns, len(keys))
                with self.budget.hold(nbytes), row_buffer(nbytes) as buf:
                    hit, sums = self._get(ns, keys, buf, "grpc", ctx)
                    yield from self._send_blocks(ns, keys, buf, hit, sums, ctx)
            except Exception as e:
                self._fail(ctx, "Get", e)
                return
            yield pb.GetResponse(done=pb.GetDone(hit_blocks=hit))

    def _get(
        self, ns: Namespace, keys: list[Key], rows: memoryview, path: str, ctx: grpc.ServicerContext
    ) -> tuple[int, list[int]]:
        """The hit prefix copied into ``rows``, with the checksums stored with its blocks."""
        sums: list[int] = []
        hit = self.store.get_into(ns, keys, rows, timeout_s=self._timeout(ctx), checksums=sums)
        self.metrics.bytes_out.labels(path, str(ns.block_bytes)).inc(hit * ns.block_bytes)
        self.ledger.count(
            ns.tenant, gets_total=1, get_blocks_total=len(keys), get_hit_blocks_total=hit
        )
        return hit, sums

    def _send_blocks(
        self,
        ns: Namespace,
        keys: list[Key],
        buf: memoryview,
        hit: int,
        sums: list[int],
        ctx: grpc.ServicerContext,
    ) -> Iterator[pb.GetResponse]:
        """Stream the hit rows; a reader that stops taking them is cancelled when idle."""
        fp, bb = ns.fingerprint, ns.block_bytes
        with self.watchdog.watch("Get", ctx) as stream:
            for i in range(hit):
                row = buf[i * bb : (i + 1) * bb]
                for chunk in codec.iter_chunks(i, fp, keys[i], row, checksum=sums[i]):
                    with stream.waiting():  # resumed once the reader has taken it
                        yield pb.GetResponse(chunk=chunk)

    def Commit(self, it: Iterator[pb.CommitRequest], ctx: grpc.ServicerContext) -> Any:
        with self.metrics.timed("Commit"):
            tenant = self._tenant(ctx, "Commit")
            try:
                with self.watchdog.watch("Commit", ctx) as stream:
                    msgs = self.metrics.counted("Commit", it)
                    return self._commit(tenant, stream.reading(msgs), ctx)
            except Exception as e:
                if isinstance(e, BlockError):
                    self.metrics.rejected_blocks.labels(type(e).__name__).inc()
                self._fail(ctx, "Commit", e)
                raise  # unreachable

    def _commit(
        self, tenant: str | None, it: Iterator[pb.CommitRequest], ctx: grpc.ServicerContext
    ) -> Any:
        first = next(it, None)
        if first is None or first.WhichOneof("part") != "open":
            raise InvalidArgument("a Commit stream must start with its CommitOpen message")
        op = first.open
        ns = self._ns(tenant, op.ns)
        keys = self._keys(op.keys)
        indices = self._indices(keys, op.indices)
        durability = codec.durability_from_proto(op.durability)
        bb = ns.block_bytes
        nbytes = self._rows_bytes(ns, len(indices))
        slots = {idx: j for j, idx in enumerate(indices)}
        with self.budget.hold(nbytes), row_buffer(nbytes) as rows:
            asm = codec.BlockAssembler(ns, keys, rows, slots)
            truncated = False
            try:
                for msg in it:
                    if msg.WhichOneof("part") != "chunk":
                        raise InvalidArgument("after CommitOpen a stream carries only chunks")
                    asm.add(msg.chunk)
            except grpc.RpcError:
                truncated = True  # the client went away (or idled): keep what fully arrived
            payloads = {idx: rows[slots[idx] * bb : (slots[idx] + 1) * bb] for idx in asm.complete}
            incomplete = len(indices) - len(asm.complete)
            if truncated or not ctx.is_active():
                log.info(
                    "commit stream ended early: %d of %d blocks complete",
                    len(payloads),
                    len(indices),
                )
            try:
                return self._store_commit(ns, keys, payloads, durability, "grpc", incomplete, ctx)
            finally:
                payloads.clear()  # drop the views so the buffer can be unmapped

    def _commit_staged(
        self,
        tenant: str | None,
        ref: pb.StagingRef,
        headers: Sequence[bytes],
        ns: Namespace,
        keys: list[Key],
        indices: list[int],
        durability: str,
        ctx: grpc.ServicerContext,
    ) -> pb.CommitResponse:
        nbytes = self._rows_bytes(ns, len(indices))
        with self.budget.hold(nbytes):  # the rows are copied out of the segment
            payloads = self._staged_payloads(tenant, ref, headers, ns, keys, indices, nbytes)
            return self._store_commit(ns, keys, payloads, durability, "shm", 0, ctx)

    def _staged_payloads(
        self,
        tenant: str | None,
        ref: pb.StagingRef,
        headers: Sequence[bytes],
        ns: Namespace,
        keys: list[Key],
        indices: list[int],
        nbytes: int,
    ) -> dict[int, memoryview]:
        if len(headers) != len(indices):
            raise InvalidArgument(f"{len(headers)} staged headers for {len(indices)} blocks")
        # Copied out first: the client can still write the segment, and bytes checked
        # there could change before they are stored.
        rows = memoryview(bytearray(self._staged_rows(tenant, ref, nbytes)))
        bb = ns.block_bytes
        out: dict[int, memoryview] = {}
        for j, idx in enumerate(indices):
            row = rows[j * bb : (j + 1) * bb]
            codec.verify_staged_header(headers[j], ns, keys[idx], row)
            out[idx] = row
        return out

    def _indices(self, keys: list[Key], raw: Sequence[int]) -> list[int]:
        indices = list(raw)
        if len(set(indices)) != len(indices) or any(i >= len(keys) for i in indices):
            raise InvalidArgument("commit indices must be distinct positions in the chain")
        return indices

    def _store_commit(
        self,
        ns: Namespace,
        keys: list[Key],
        payloads: dict[int, memoryview],
        durability: str,
        path: str,
        incomplete: int,
        ctx: grpc.ServicerContext,
    ) -> pb.CommitResponse:
        res = self.store.commit(
            ns,
            keys,
            payloads,
            durability=durability,  # type: ignore[arg-type]
            timeout_s=self._timeout(ctx),
        )
        self.metrics.bytes_in.labels(path, str(ns.block_bytes)).inc(res.inserted * ns.block_bytes)
        self.ledger.count(
            ns.tenant,
            commits_total=1,
            commit_blocks_total=res.inserted,
            commit_present_blocks_total=res.present,
            dropped_blocks_total=res.dropped,
        )
        self.ledger.note_commit(ns.tenant, self.store)
        return pb.CommitResponse(
            inserted=res.inserted,
            present=res.present,
            dropped=res.dropped,
            durability=codec.durability_to_proto(res.durability),
            incomplete=incomplete,
        )

    def GetStaged(self, req: pb.GetStagedRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.GetDone:
            ns = self._ns(tenant, req.ns)
            keys = self._keys(req.keys)
            rows = self._staged_rows(tenant, req.staging, self._rows_bytes(ns, len(keys)))
            hit, sums = self._get(ns, keys, rows, "shm", ctx)
            return pb.GetDone(hit_blocks=hit, checksums=sums)

        return self._unary(ctx, "GetStaged", run)

    def CommitStaged(self, req: pb.CommitStagedRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.CommitResponse:
            ns = self._ns(tenant, req.ns)
            keys = self._keys(req.keys)
            indices = self._indices(keys, req.indices)
            durability = codec.durability_from_proto(req.durability)
            return self._commit_staged(
                tenant, req.staging, req.headers, ns, keys, indices, durability, ctx
            )

        return self._unary(ctx, "CommitStaged", run)

    def Prefetch(self, req: pb.PrefetchRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.PrefetchResponse:
            ns = self._ns(tenant, req.ns)
            keys = self._keys(req.keys)
            n = self.store.prefetch(ns, keys, timeout_s=self._timeout(ctx)).result(
                self._timeout(ctx)
            )
            return pb.PrefetchResponse(top_tier_blocks=n)

        return self._unary(ctx, "Prefetch", run)

