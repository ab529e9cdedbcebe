"""Bearer-token authentication and namespace ownership (DESIGN §7).

``--auth-token-file`` holds ``token tenant`` lines; a third field ``admin`` marks a token
that sees every tenant's stats and may delete a whole tenant (it still reads and writes
only its own tenant's namespaces). Every RPC carries
``authorization: Bearer TOKEN``; the token is compared in constant time against every
known token (no early exit, no dict lookup keyed by the secret), and a tenant may only
name namespaces whose ``tenant`` field is its own. Without a token file every caller is
trusted (``OpenAuth``, the null object) — fine on loopback, warned about elsewhere.

**Delegation** (DESIGN §7): a token whose tenant ends in ``/*`` (``token engine-1/*``) is
granted that prefix: it may use the tenant ``engine-1/*`` itself and every tenant
``engine-1/NAME``. An engine serving many tenants of its own over one daemon
(``kvengine serve --auth-token-file``) registers ``engine-1/<http tenant>`` namespaces with
it, so its tenants never share blocks and no other token can reach them.
"""

from __future__ import annotations

import hmac
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.textfile import read_text
from kvstore.wire.errors import AccessDenied

DELEGATION_SUFFIX = "/*"


def owns(caller_tenant: str, ns_tenant: str) -> bool:
    """Whether a token of ``caller_tenant`` may use namespaces of ``ns_tenant``."""
    if ns_tenant == caller_tenant:
        return True
    if not caller_tenant.endswith(DELEGATION_SUFFIX):
        return False
    prefix = caller_tenant[:-1]  # "engine-1/"
    return ns_tenant.startswith(prefix) and len(ns_tenant) > len(prefix)


class AuthError(Exception):
    """The caller did not present a valid token (maps to UNAUTHENTICATED)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling: ``tenant`` None means unrestricted (no token file); ``admin`` sees
    the whole daemon (Stats, Flush) and may delete tenants."""

    tenant: str | None
    admin: bool = False

    @property
    def sees_everything(self) -> bool:
        return self.tenant is None or self.admin


class Authenticator(ABC):
    """Turns request metadata into a tenant and guards namespace ownership."""

    @abstractmethod
    def tenant_of(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        """The caller's tenant (``None``: unrestricted); raises ``AuthError``."""

    def caller(self, metadata: Sequence[tuple[str, str | bytes]]) -> Caller:
        """The caller's tenant and rights; raises ``AuthError``."""
        return Caller(self.tenant_of(metadata))

    def check_namespace(self, tenant: str | None, ns: Namespace) -> None:
        """Raise ``AccessDenied`` unless ``tenant`` owns ``ns``."""
        if tenant is not None and not owns(tenant, ns.tenant):
            raise AccessDenied(
                f"namespace of tenant {ns.tenant!r} is not accessible to tenant {tenant!r}"
            )

    @property
    def enabled(self) -> bool:
        return True


class OpenAuth(Authenticator):
    def tenant_of(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        return None

    @property
    def enabled(self) -> bool:
        return False


class TokenAuth(Authenticator):
    def __init__(self, tokens: dict[str, str], admins: frozenset[str] = frozenset()) -> None:
        """``tokens`` maps token -> tenant; tokens in ``admins`` carry the admin right."""
        if not tokens:
            raise InvalidArgument("the auth token file defines no tokens")
        self._tokens = [
            (t.encode(), Caller(tenant, admin=t in admins)) for t, tenant in tokens.items()
        ]

    @property
    def tenants(self) -> frozenset[str]:
        """The distinct tenants of the file (how many users a server has)."""
        return frozenset(who.tenant for _, who in self._tokens if who.tenant is not None)

    def tenant_of(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        return self.caller(metadata).tenant

    def caller(self, metadata: Sequence[tuple[str, str | bytes]]) -> Caller:
        presented = b""
        for k, v in metadata:
            if k == "authorization":
                value = v.encode() if isinstance(v, str) else v
                if not value.startswith(b"Bearer "):
                    raise AuthError("authorization must be 'Bearer TOKEN'")
                presented = value[len(b"Bearer ") :]
        if not presented:
            raise AuthError("missing authorization: Bearer TOKEN")
        found: Caller | None = None
        for token, who in self._tokens:  # all compared: timing does not depend on which
            if hmac.compare_digest(token, presented):
                found = who
        if found is None:
            raise AuthError("unknown token")
        return found


def load_token_file(path: str, what: str = "--auth-token-file") -> TokenAuth:
    """Parse ``token tenant [admin]`` lines (``#`` comments, blank lines ignored); a file
    that cannot be read, or is not text, is an error naming it (as ``what``, its flag)."""
    tokens: dict[str, str] = {}
    admins: set[str] = set()
    for n, raw in enumerate(read_text(path, what).splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "admin"):
            raise InvalidArgument(f"{path}:{n}: expected 'token tenant' or 'token tenant admin'")
        token, tenant = parts[:2]
        if len(parts) == 3:
            admins.add(token)
        if len(token) < 16:
            raise InvalidArgument(f"{path}:{n}: token shorter than 16 characters")
        if token in tokens:
            raise InvalidArgument(f"{path}:{n}: duplicate token")
        tokens[token] = tenant
    return TokenAuth(tokens, frozenset(admins))
