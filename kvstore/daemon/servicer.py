"""The ``KVStore`` gRPC service over any ``KVStore`` implementation (DESIGN §7).

Every RPC authenticates first, then checks that the caller's tenant owns the namespace
it names, then validates the whole request before touching the store, so a refused or
malformed request has no side effects. ``Commit`` buffers the blocks of one request,
verifies each one's header and checksum as it completes, and commits once: a malformed
chunk aborts the request with nothing stored, while a stream that ends early (the
client went away) commits the complete, verified blocks before the break and nothing
else (DESIGN §7).

Checksums end to end (DESIGN §4): what the daemon sends with a block is the checksum
stored with it since its commit, never one computed from its own memory, so a byte
damaged here fails at the client. Staged rows are copied out of the client-writable
segment before they are checked and committed, so what is checked is what is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from clients import codec
from clients.proto import kvstore_pb2 as pb
from clients.proto import kvstore_pb2_grpc as pb_grpc
from clients.requests import stats_to_proto
from kvstore.block import now_us
from kvstore.daemon.access_log import AccessLog, LookupRecord
from kvstore.daemon.auth import Authenticator
from kvstore.daemon.config import ServerLimits
from kvstore.daemon.metrics import DaemonMetrics
from kvstore.daemon.rpc_plumbing import RpcPlumbing
from kvstore.daemon.staging import DATA_OFFSET, StagingArea
from kvstore.errors import BlockError, InvalidArgument
from kvstore.keys import Key, Namespace
from kvstore.tier import KVStore

log = logging.getLogger(__name__)


class KVStoreServicer(RpcPlumbing, pb_grpc.KVStoreServicer):
    def __init__(
        self,
        store: KVStore,
        auth: Authenticator,
        access_log: AccessLog,
        metrics: DaemonMetrics,
        staging: StagingArea | None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.store = store
        self.auth = auth
        self.access_log = access_log
        self.metrics = metrics
        self.staging = staging
        self.limits = limits if limits is not None else ServerLimits()

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
            res = self.store.lookup(ns, keys, timeout_s=self._timeout(ctx))
            tiers = tuple(res.tiers)
            self.metrics.record_lookup(ns.block_bytes, ns.block_tokens, len(keys), tiers)
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
                bb = ns.block_bytes
                sums: list[int] = []
                if req.HasField("staging"):
                    rows = self._staged_rows(tenant, req.staging, nbytes)
                    hit = self.store.get_into(
                        ns, keys, rows, timeout_s=self._timeout(ctx), checksums=sums
                    )
                    self.metrics.bytes_out.labels("shm", str(bb)).inc(hit * bb)
                    yield pb.GetResponse(done=pb.GetDone(hit_blocks=hit, checksums=sums))
                    return
                buf = memoryview(bytearray(nbytes))
                hit = self.store.get_into(
                    ns, keys, buf, timeout_s=self._timeout(ctx), checksums=sums
                )
            except Exception as e:
                self._fail(ctx, "Get", e)
                return
            fp = ns.fingerprint
            for i in range(hit):
                row = buf[i * bb : (i + 1) * bb]
                for chunk in codec.iter_chunks(i, fp, keys[i], row, checksum=sums[i]):
                    yield pb.GetResponse(chunk=chunk)
            self.metrics.bytes_out.labels("grpc", str(bb)).inc(hit * bb)
            yield pb.GetResponse(done=pb.GetDone(hit_blocks=hit))

    def Commit(self, it: Iterator[pb.CommitRequest], ctx: grpc.ServicerContext) -> Any:
        with self.metrics.timed("Commit"):
            tenant = self._tenant(ctx, "Commit")
            try:
                return self._commit(tenant, it, ctx)
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
        if op.HasField("staging"):
            msg = next(it, None)
            if msg is None or msg.WhichOneof("part") != "staged" or next(it, None) is not None:
                raise InvalidArgument("a staged Commit carries exactly one StagedHeaders message")
            payloads = self._staged_payloads(
                tenant, op.staging, msg.staged.headers, ns, keys, indices, nbytes
            )
            path, incomplete = "shm", 0
        else:
            rows = memoryview(bytearray(nbytes))
            asm = codec.BlockAssembler(ns, keys, rows, slots)
            truncated = False
            try:
                for msg in it:
                    if msg.WhichOneof("part") != "chunk":
                        raise InvalidArgument("after CommitOpen a stream carries only chunks")
                    asm.add(msg.chunk)
            except grpc.RpcError:
                truncated = True  # the client went away: keep what fully arrived
            payloads = {idx: rows[slots[idx] * bb : (slots[idx] + 1) * bb] for idx in asm.complete}
            path, incomplete = "grpc", len(indices) - len(asm.complete)
            if truncated or not ctx.is_active():
                log.info(
                    "commit stream ended early: %d of %d blocks complete",
                    len(payloads),
                    len(indices),
                )
        return self._store_commit(ns, keys, payloads, durability, path, incomplete, ctx)

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
            sums: list[int] = []
            hit = self.store.get_into(ns, keys, rows, timeout_s=self._timeout(ctx), checksums=sums)
            self.metrics.bytes_out.labels("shm", str(ns.block_bytes)).inc(hit * ns.block_bytes)
            return pb.GetDone(hit_blocks=hit, checksums=sums)

        return self._unary(ctx, "GetStaged", run)

    def CommitStaged(self, req: pb.CommitStagedRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.CommitResponse:
            ns = self._ns(tenant, req.ns)
            keys = self._keys(req.keys)
            indices = self._indices(keys, req.indices)
            durability = codec.durability_from_proto(req.durability)
            nbytes = self._rows_bytes(ns, len(indices))
            payloads = self._staged_payloads(
                tenant, req.staging, req.headers, ns, keys, indices, nbytes
            )
            return self._store_commit(ns, keys, payloads, durability, "shm", 0, ctx)

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

    def Flush(self, req: pb.FlushRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.FlushResponse:
            self.store.flush(timeout_s=self._timeout(ctx))
            return pb.FlushResponse()

        return self._unary(ctx, "Flush", run)

    def Stats(self, req: pb.StatsRequest, ctx: grpc.ServicerContext) -> Any:
        return self._unary(
            ctx,
            "Stats",
            lambda tenant: stats_to_proto(self.store.stats(timeout_s=self._timeout(ctx))),
        )

    def OpenStaging(self, req: pb.OpenStagingRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.OpenStagingResponse:
            if self.staging is None:
                raise InvalidArgument("this daemon offers no shared-memory staging")
            seg = self.staging.open(tenant, req.size_bytes)
            return pb.OpenStagingResponse(
                staging_id=seg.id,
                path=seg.path,
                size_bytes=seg.size_bytes,
                data_offset=DATA_OFFSET,
                nonce=seg.nonce,
            )

        return self._unary(ctx, "OpenStaging", run)

    def CloseStaging(self, req: pb.CloseStagingRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.CloseStagingResponse:
            if self.staging is None:
                raise InvalidArgument("this daemon offers no shared-memory staging")
            self.staging.close_segment(tenant, req.staging_id)
            return pb.CloseStagingResponse()

        return self._unary(ctx, "CloseStaging", run)
