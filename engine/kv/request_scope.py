"""Whose blocks a request may hit: its tenant and its cache salt, folded into the namespace.

An engine serves one model, so its namespaces (``engine.kv.namespace``) are fixed; a server
adds who is asking. ``RequestScope.apply(ns)`` turns an engine namespace into the request's:

- ``tenant`` replaces the namespace's tenant, so two tenants' chains have different roots
  and never share a hit, in the pool or in the store (DESIGN §3, §11). ``None`` keeps the
  engine's own tenant (the one the store's token maps to).
- ``cache_salt`` (OpenAI/vLLM's per-request isolation knob) is folded into
  ``model_revision`` as ``<revision>+salt:<xxh3-128 hex of the salt>``: requests with
  different salts never share a hit, while the tenant field stays the one the daemon
  checks. The salt itself never reaches the store, only its digest.

The default scope is the identity, so the engine run without a server behaves as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import xxhash

from kvstore.keys import Namespace


@dataclass(frozen=True, slots=True)
class RequestScope:
    tenant: str | None = None  # None: the engine namespace's own tenant
    cache_salt: str | None = None  # None or "": no salt

    @property
    def is_identity(self) -> bool:
        return self.tenant is None and not self.cache_salt

    def apply(self, ns: Namespace) -> Namespace:
        if self.is_identity:
            return ns
        tenant = ns.tenant if self.tenant is None else self.tenant
        revision = ns.model_revision
        if self.cache_salt:
            digest = xxhash.xxh3_128(self.cache_salt.encode()).hexdigest()
            revision = f"{revision}+salt:{digest}"
        return dataclasses.replace(ns, tenant=tenant, model_revision=revision)


IDENTITY = RequestScope()
