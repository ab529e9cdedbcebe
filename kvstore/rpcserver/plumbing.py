"""Authentication, error mapping and timing shared by every servicer (daemon and node)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import grpc

from kvstore.rpcserver.auth import Authenticator, AuthError, Caller
from kvstore.rpcserver.metrics import RpcMetrics
from kvstore.wire.status import status_for

log = logging.getLogger(__name__)
T = TypeVar("T")


class RpcPlumbing:
    """Mixin: ``auth`` and ``metrics`` are set by the servicer's constructor.

    Every RPC runs through ``_unary`` (or calls ``_tenant``/``_fail`` itself for streams):
    it is timed, authenticated first, and any exception becomes a gRPC status — a misuse
    a client error, an unexpected one INTERNAL and logged — never a stack in the caller.
    """

    auth: Authenticator
    metrics: RpcMetrics

    def _tenant(self, ctx: grpc.ServicerContext, method: str) -> str | None:
        return self._caller(ctx, method).tenant

    def _caller(self, ctx: grpc.ServicerContext, method: str) -> Caller:
        try:
            return self.auth.caller(ctx.invocation_metadata())
        except AuthError as e:
            self.metrics.rpc_errors.labels(method, "UNAUTHENTICATED").inc()
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, str(e))
            raise  # unreachable: abort raises

    def _fail(self, ctx: grpc.ServicerContext, method: str, exc: Exception) -> None:
        code, details = status_for(exc)
        if code == grpc.StatusCode.INTERNAL:
            log.exception("%s failed", method)
        self.metrics.rpc_errors.labels(method, code.name).inc()
        ctx.abort(code, details)

    def _unary(self, ctx: grpc.ServicerContext, method: str, fn: Callable[[str | None], T]) -> T:
        return self._unary_as(ctx, method, lambda caller: fn(caller.tenant))

    def _unary_as(self, ctx: grpc.ServicerContext, method: str, fn: Callable[[Caller], T]) -> T:
        """``_unary`` for calls whose answer depends on the caller's rights, not only its
        tenant (Stats, Flush, WhoAmI, DeleteTenant)."""
        with self.metrics.timed(method):
            caller = self._caller(ctx, method)
            try:
                return fn(caller)
            except Exception as e:
                self._fail(ctx, method, e)
                raise  # unreachable
