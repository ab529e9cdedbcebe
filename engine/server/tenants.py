"""HTTP tenants: who a bearer token is, and which namespace tenant their requests carry.

``--auth-token-file`` holds ``token tenant`` lines (the daemon's format, parsed by the same
code: ``#`` comments, tokens of at least 16 characters, compared in constant time). A
request without a valid ``Authorization: Bearer TOKEN`` gets a 401. Without the file every
request is anonymous and uses the engine's own namespace.

The HTTP tenant goes into the namespace of the request (``RequestScope``), so tenants never
share hits. Which namespace tenant that is depends on the store (DESIGN §7, delegation):

- no store, the embedded store, or a daemon without auth (the store's tenant is ``""``):
  the HTTP tenant itself;
- a daemon whose token is *delegating* (its tenant is ``P/*`` in the daemon's token file):
  ``P/<http tenant>``, which the daemon accepts from that token and from no other;
- a daemon token with a plain tenant cannot carry HTTP tenants: ``kvengine serve`` refuses
  to start with ``--auth-token-file`` then (one line, exit 2), rather than mixing tenants.
"""

from __future__ import annotations

from engine.errors import EngineInputError
from engine.kv.request_scope import RequestScope
from engine.server.errors import unauthorized
from kvstore.errors import InvalidArgument
from kvstore.rpcserver.auth import AuthError, TokenAuth, load_token_file

DELEGATION_SUFFIX = "/*"


def namespace_tenant(store_tenant: str, http_tenant: str) -> str:
    """The namespace tenant of a request of ``http_tenant`` over a store whose token maps
    to ``store_tenant``."""
    if not store_tenant:
        return http_tenant
    if store_tenant.endswith(DELEGATION_SUFFIX):
        return store_tenant[: -len(DELEGATION_SUFFIX)] + "/" + http_tenant
    raise EngineInputError(
        f"the store's token maps to tenant {store_tenant!r}, which cannot carry HTTP tenants: "
        f"give the engine a delegating token ('TOKEN {store_tenant}{DELEGATION_SUFFIX}' in the "
        f"daemon's token file) or serve without --auth-token-file")


class Tenants:
    def __init__(self, token_file: str | None, store_tenant: str) -> None:
        self.store_tenant = store_tenant
        self._auth: TokenAuth | None = None
        if token_file is not None:
            try:
                self._auth = load_token_file(token_file)
            except InvalidArgument as e:
                raise EngineInputError(f"--auth-token-file: {e}") from None
            namespace_tenant(store_tenant, "check")  # refuse a store that cannot carry them

    @property
    def enabled(self) -> bool:
        return self._auth is not None

    def authenticate(self, authorization: str | None) -> str | None:
        """The HTTP tenant of a request (None: auth is off); raises a 401 ``APIError``."""
        if self._auth is None:
            return None
        if not authorization:
            raise unauthorized("missing Authorization: Bearer TOKEN")
        try:
            caller = self._auth.caller([("authorization", authorization)])
        except AuthError as e:
            raise unauthorized(f"invalid API key: {e}") from None
        return caller.tenant

    def scope(self, http_tenant: str | None, cache_salt: str | None) -> RequestScope:
        tenant = None if http_tenant is None else namespace_tenant(self.store_tenant,
                                                                   http_tenant)
        return RequestScope(tenant=tenant, cache_salt=cache_salt or None)
