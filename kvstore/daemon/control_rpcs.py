"""The daemon's RPCs that are not about one namespace: Stats, Flush, WhoAmI, DeleteTenant
and the staging segments (DESIGN §7).

A tenant's token sees and waits for its own tenant only: ``Stats`` shows tier
capacities, what its namespaces hold and its own counters; ``Flush`` waits for its own
accepted blocks. A delegating token (``P/*``) sees and waits for itself and every
``P/NAME`` together. An admin token (``token tenant admin`` in the token file), or any
caller of a daemon without a token file, sees the whole daemon, and an admin may delete
a whole tenant: every namespace the daemon has known of it, from every tier.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import grpc

from kvstore.daemon.catalog import MemoryCatalog
from kvstore.daemon.staging import DATA_OFFSET, StagingArea
from kvstore.daemon.tenants import TenantLedger, footprints, held_blocks, tenant_stats
from kvstore.errors import InvalidArgument
from kvstore.rpcserver.auth import Caller, owns
from kvstore.rpcserver.plumbing import RpcPlumbing
from kvstore.tier import KVStore
from kvstore.wire.errors import NotAdmin
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.stats import stats_to_proto

log = logging.getLogger(__name__)


def _scope(caller: Caller) -> Callable[[str], bool] | None:
    """The tenants a caller's Stats and Flush cover (``None``: the whole daemon). A
    delegating token (``P/*``) covers itself and every ``P/NAME`` it may act for."""
    if caller.sees_everything:
        return None
    tenant = caller.tenant
    assert tenant is not None  # sees_everything otherwise
    return functools.partial(owns, tenant)


class ControlRpcs(RpcPlumbing):
    """Mixin of ``KVStoreServicer``; its constructor sets these."""

    store: KVStore
    staging: StagingArea | None
    ledger: TenantLedger
    catalog: MemoryCatalog

    def Flush(self, req: pb.FlushRequest, ctx: grpc.ServicerContext) -> Any:
        def run(caller: Caller) -> pb.FlushResponse:
            self.ledger.flush(_scope(caller), self.store, ctx.time_remaining())
            return pb.FlushResponse()

        return self._unary_as(ctx, "Flush", run)

    def Stats(self, req: pb.StatsRequest, ctx: grpc.ServicerContext) -> Any:
        def run(caller: Caller) -> pb.StatsResponse:
            whole = self.store.stats(timeout_s=ctx.time_remaining())
            if caller.sees_everything:
                return stats_to_proto(whole)
            scope = _scope(caller)
            assert scope is not None  # sees_everything otherwise
            held = held_blocks(self.store, self.catalog.of_tenants(scope))
            mine = tenant_stats(
                whole, held, self.ledger.counters_of(scope), footprints(self.store)
            )
            return stats_to_proto(mine)

        return self._unary_as(ctx, "Stats", run)

    def WhoAmI(self, req: pb.WhoAmIRequest, ctx: grpc.ServicerContext) -> Any:
        def run(caller: Caller) -> pb.WhoAmIResponse:
            return pb.WhoAmIResponse(
                tenant=caller.tenant or "",
                admin=caller.sees_everything,
                authenticated=self.auth.enabled,
            )

        return self._unary_as(ctx, "WhoAmI", run)

    def DeleteTenant(self, req: pb.DeleteTenantRequest, ctx: grpc.ServicerContext) -> Any:
        def run(caller: Caller) -> pb.DeleteTenantResponse:
            if not caller.sees_everything:
                raise NotAdmin("deleting a tenant needs an admin token")
            namespaces = self.catalog.of_tenant(req.tenant)
            deleted = 0
            for ns in namespaces:
                # Known from before a restart, perhaps: the store must know it to delete it.
                self.store.register(ns, timeout_s=ctx.time_remaining())
                deleted += self.store.delete_namespace(ns, timeout_s=ctx.time_remaining())
            self.catalog.forget(namespaces)
            self.ledger.forget(req.tenant)
            log.info(
                "deleted tenant %r: %d namespaces, %d blocks", req.tenant, len(namespaces), deleted
            )
            return pb.DeleteTenantResponse(deleted_blocks=deleted, namespaces=len(namespaces))

        return self._unary_as(ctx, "DeleteTenant", run)

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
