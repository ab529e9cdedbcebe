"""What the daemon says about the caller (``WhoAmI``) and what an admin's tenant delete did."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Identity:
    """``tenant`` is what the namespaces of this client must carry (DESIGN §7); when the
    daemon has no token file, ``authenticated`` is False and any tenant is accepted."""

    tenant: str
    admin: bool
    authenticated: bool


@dataclass(frozen=True, slots=True)
class TenantDeleted:
    deleted_blocks: int
    namespaces: int
