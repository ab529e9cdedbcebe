"""Node authentication: the cache daemon's token file, plus the ``*`` tenant.

A node is reached by cache daemons that serve every tenant, so a node's token file
may name the tenant ``*``: that token may use any namespace. Any other tenant is held
to its own namespaces exactly as the cache daemon holds it (DESIGN §7).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.rpcserver.auth import Authenticator, OpenAuth, TokenAuth, load_token_file

ANY_TENANT = "*"


class NodeAuth(Authenticator):
    def __init__(self, inner: TokenAuth) -> None:
        self._inner = inner

    def tenant_of(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        tenant = self._inner.tenant_of(metadata)
        return None if tenant == ANY_TENANT else tenant


def make_node_auth(token_file: str | None) -> Authenticator:
    return NodeAuth(load_token_file(token_file)) if token_file else OpenAuth()
