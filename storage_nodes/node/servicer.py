"""The ``StorageNode`` gRPC service over one ``Tier`` (the SSD engine; DESIGN §7).

A node trusts nothing it receives: every block of a ``Put`` is reassembled and its
header (fingerprint, key, length) and checksum verified before it is stored, a
malformed stream stores nothing, and a stream cut short stores the complete blocks
before the break and nothing else. Namespaces are registered on first use, so a node
needs no configuration beyond its directory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from kvstore.errors import BlockError, InvalidArgument, StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.rpcserver.auth import Authenticator
from kvstore.rpcserver.limits import ServerLimits
from kvstore.rpcserver.metrics import RpcMetrics
from kvstore.rpcserver.plumbing import RpcPlumbing
from kvstore.tier import Tier
from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from kvstore.wire.stats import tier_stats_to_proto

log = logging.getLogger(__name__)

NOT_STORED, INSERTED, PRESENT = 0, 1, 2


class StorageNodeServicer(RpcPlumbing, pb_grpc.StorageNodeServicer):
    def __init__(
        self,
        tier: Tier,
        auth: Authenticator,
        metrics: RpcMetrics,
        limits: ServerLimits | None = None,
    ) -> None:
        self.tier = tier
        self.auth = auth
        self.metrics = metrics
        self.limits = limits or ServerLimits()
        self._registered: set[bytes] = set()
        self._reg_lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------
    def _ns(self, tenant: str | None, spec: pb.NamespaceSpec) -> Namespace:
        ns = codec.ns_from_proto(spec)
        self.auth.check_namespace(tenant, ns)
        if ns.fingerprint not in self._registered:
            with self._reg_lock:
                self.tier.register(ns)
                self._registered.add(ns.fingerprint)
        return ns

    def _keys(self, ns: Namespace, keys: Any) -> list[Key]:
        lim = self.limits
        if len(keys) > lim.max_keys_per_request:
            raise InvalidArgument(
                f"{len(keys)} keys exceed the limit of {lim.max_keys_per_request}"
            )
        if len(keys) * ns.block_bytes > lim.max_request_bytes:
            raise InvalidArgument(
                f"{len(keys)} blocks exceed the request limit of {lim.max_request_bytes} bytes"
            )
        return codec.check_keys(keys)

    # -- RPCs -------------------------------------------------------------------------
    def Put(self, it: Iterator[pb.NodePutRequest], ctx: grpc.ServicerContext) -> Any:
        with self.metrics.timed("Put"):
            tenant = self._tenant(ctx, "Put")
            try:
                return self._put(tenant, self.metrics.counted("Put", it), ctx.time_remaining())
            except Exception as e:
                if isinstance(e, BlockError):
                    self.metrics.rejected_blocks.labels(type(e).__name__).inc()
                self._fail(ctx, "Put", e)
                raise  # unreachable

    def _put(
        self, tenant: str | None, it: Iterator[pb.NodePutRequest], timeout_s: float | None
    ) -> pb.NodePutResponse:
        first = next(it, None)
        if first is None or first.WhichOneof("part") != "open":
            raise InvalidArgument("a Put stream must start with its NodePutOpen message")
        op = first.open
        ns = self._ns(tenant, op.ns)
        keys = self._keys(ns, op.keys)
        if len(set(keys)) != len(keys):
            raise InvalidArgument("put: duplicate keys in one request")
        bb = ns.block_bytes
        rows = memoryview(bytearray(len(keys) * bb))
        asm = codec.BlockAssembler(ns, keys, rows, {i: i for i in range(len(keys))})
        try:
            for msg in it:
                if msg.WhichOneof("part") != "chunk":
                    raise InvalidArgument("after NodePutOpen a stream carries only chunks")
                asm.add(msg.chunk)
        except grpc.RpcError:
            log.info(
                "put stream ended early: %d of %d blocks complete", len(asm.complete), len(keys)
            )
        done = sorted(asm.complete)  # chain order: the tier applies it last→first
        outcomes = bytearray(len(keys))
        if done:
            dkeys = [keys[i] for i in done]
            # Usually every block arrived: the rows are then already in chain order.
            complete = len(done) == len(keys)
            data = rows if complete else b"".join(rows[i * bb : (i + 1) * bb] for i in done)
            before = [self.tier.contains(ns, [k]) == 1 for k in dkeys]
            # The checksums the sender made at commit (verified against these rows) are
            # the ones stored: DESIGN §4, end to end.
            sums = [asm.checksums[i] for i in done]
            res = self.tier.put(ns, dkeys, data, present_ok=op.present_ok, checksums=sums)
            # The sender counts this answer towards its write quorum, so an inserted
            # block is acknowledged only once durable (the SSD syncs behind its puts).
            synced = res.inserted == 0 or self._synced(timeout_s)
            # Without drops every new block is stored (or raced in by another put, which
            # is as good an acknowledgement); with drops ask which ones made it.
            after = (
                before if res.dropped == 0 else [self.tier.contains(ns, [k]) == 1 for k in dkeys]
            )
            for i, was, now in zip(done, before, after, strict=True):
                stored = synced and (now or res.dropped == 0)
                outcomes[i] = PRESENT if was else INSERTED if stored else NOT_STORED
            self.metrics.bytes_in.labels("grpc", str(bb)).inc(res.inserted * bb)
        return pb.NodePutResponse(
            inserted=sum(o == INSERTED for o in outcomes),
            present=sum(o == PRESENT for o in outcomes),
            dropped=sum(outcomes[i] == NOT_STORED for i in done),
            incomplete=len(keys) - len(done),
            outcomes=bytes(outcomes),
        )

    def _synced(self, timeout_s: float | None) -> bool:
        try:
            return self.tier.sync(timeout_s=timeout_s)
        except StoreUnavailable:  # the call's deadline: the sender hears nothing anyway
            return False

    def Get(
        self, req: pb.NodeKeysRequest, ctx: grpc.ServicerContext
    ) -> Iterator[pb.NodeGetResponse]:
        with self.metrics.timed("Get"):
            tenant = self._tenant(ctx, "Get")
            try:
                ns = self._ns(tenant, req.ns)
                keys = self._keys(ns, req.keys)
                bb = ns.block_bytes
                buf = memoryview(bytearray(len(keys) * bb))
                sums: list[int] = []
                hit = self.tier.get_into(ns, keys, buf, checksums=sums)
            except Exception as e:
                self._fail(ctx, "Get", e)
                return
            fp = ns.fingerprint
            for i in range(hit):
                # The stored checksum, not one of ``buf``: a byte damaged in this process's
                # memory since the engine checked it must fail at the cluster client.
                row = buf[i * bb : (i + 1) * bb]
                for chunk in codec.iter_chunks(i, fp, keys[i], row, checksum=sums[i]):
                    yield pb.NodeGetResponse(chunk=chunk)
            self.metrics.bytes_out.labels("grpc", str(bb)).inc(hit * bb)
            yield pb.NodeGetResponse(done=pb.GetDone(hit_blocks=hit))

    def Contains(self, req: pb.NodeKeysRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.NodeContainsResponse:
            ns = self._ns(tenant, req.ns)
            return pb.NodeContainsResponse(
                hit_blocks=self.tier.contains(ns, self._keys(ns, req.keys))
            )

        return self._unary(ctx, "Contains", run)

    def Touch(self, req: pb.NodeKeysRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.NodeTouchResponse:
            ns = self._ns(tenant, req.ns)
            self.tier.touch(ns, self._keys(ns, req.keys))
            return pb.NodeTouchResponse()

        return self._unary(ctx, "Touch", run)

    def Delete(self, req: pb.NodeDeleteRequest, ctx: grpc.ServicerContext) -> Any:
        def run(tenant: str | None) -> pb.NodeDeleteResponse:
            ns = self._ns(tenant, req.ns)
            return pb.NodeDeleteResponse(deleted_blocks=self.tier.delete_namespace(ns))

        return self._unary(ctx, "Delete", run)

    def Stats(self, req: pb.StatsRequest, ctx: grpc.ServicerContext) -> Any:
        return self._unary(ctx, "Stats", lambda tenant: tier_stats_to_proto(self.tier.stats()))
