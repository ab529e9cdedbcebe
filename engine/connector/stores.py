"""``--kv-store`` values to store links: a registry of schemes.

- ``none``: no store; prefix caching in the pool only (``NullStoreLink``).
- ``embedded[:DIR]``: DRAM plus the SSD engine in this process
  (``kvstore.embedded.open_embedded``); DIR defaults to a directory under the user's
  cache dir. One process at a time may open a directory (the SSD engine's lock).
- ``grpc://HOST:PORT`` / ``grpcs://HOST:PORT``: a running ``kvstore serve``
  (``clients.sync_client.GrpcStore``).

The namespace is built after the store is open, because its tenant is the one the store's
token maps to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clients.errors import CircuitOpen
from engine.connector.store_link import KVStoreLink, NullStoreLink, StoreLink
from engine.errors import EngineInputError
from kvstore.errors import KVStoreError, StoreUnavailable
from kvstore.keys import Namespace
from kvstore.tier import KVStore

log = logging.getLogger("engine.store")

#: past the identity wait's deadline, how often a call the client's breaker skipped is
#: retried until one goes through (a skip costs no I/O)
_SKIP_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class StoreOptions:
    dram_bytes: int = 1 << 30  # embedded: the DRAM tier
    ssd_capacity_bytes: int = 8 << 30  # embedded: the SSD tier
    auth_token_file: str | None = None  # grpc: the bearer token (else $KVSTORE_AUTH_TOKEN)
    call_timeout_s: float = 5.0
    # How long opening the link keeps asking an unreachable store its tenant (the
    # namespaces are built from it); after that the link asks before each call.
    identity_wait_s: float = 10.0


def default_store_dir() -> Path:
    """``store/`` in the engine's cache directory (``~/.cache/kvengine/store``)."""
    from engine.model.revision import default_cache_dir

    return default_cache_dir() / "store"


def _open_embedded(url: str, opts: StoreOptions) -> KVStore:
    from kvstore.embedded import open_embedded
    from kvstore.host import check_memory

    # The one check every command sizing an embedded store makes (its flag is --dram),
    # before the directory or the DRAM buffer exists.
    check_memory("--dram", opts.dram_bytes)
    arg = url.partition(":")[2]
    path = Path(arg) if arg else default_store_dir()
    path.mkdir(parents=True, exist_ok=True)
    return open_embedded(
        dram_bytes=opts.dram_bytes,
        ssd_dir=str(path),
        ssd_capacity_bytes=opts.ssd_capacity_bytes,
    )


def _open_grpc(url: str, opts: StoreOptions) -> KVStore:
    from clients.sync_client import GrpcStore

    return GrpcStore.from_url(
        url, token_file=opts.auth_token_file, default_timeout_s=opts.call_timeout_s
    )


# scheme prefix -> (link name, opener)
_OPENERS: dict[str, tuple[str, Callable[[str, StoreOptions], KVStore]]] = {
    "embedded": ("embedded", _open_embedded),
    "embedded:": ("embedded", _open_embedded),
    "grpc://": ("grpc", _open_grpc),
    "grpcs://": ("grpc", _open_grpc),
}


def store_tenant(store: KVStore, timeout_s: float = 5.0) -> str:
    """The tenant the store's credentials map to ("" for an embedded store or a daemon
    without auth), from the daemon (``GrpcStore.tenant``) when the store can ask it. Raises
    ``StoreUnavailable`` when it cannot answer now."""
    if not callable(getattr(type(store), "tenant", None)):
        return ""
    return str(store.tenant(timeout_s=timeout_s))  # type: ignore[attr-defined]


def open_store_link(
    url: str, make_ns: Callable[[str], Namespace], opts: StoreOptions = StoreOptions()
) -> StoreLink:
    """Open the store ``url`` names and its link for the namespace ``make_ns(tenant)``."""
    if url == "none":
        return NullStoreLink(make_ns(""))
    scheme = "embedded" if url == "embedded" else url.partition(":")[0] + ":"
    if url.startswith(("grpc://", "grpcs://")):
        scheme = url.partition("//")[0] + "//"
    opener = _OPENERS.get(scheme)
    if opener is None:
        raise EngineInputError(
            f"--kv-store {url!r}: expected none, embedded[:DIR] or grpc://HOST:PORT"
        )
    name, open_ = opener
    try:
        store = open_(url, opts)
    except KVStoreError as e:  # a locked SSD directory, a bad URL, an unreadable token
        raise EngineInputError(f"--kv-store {url}: {e}") from None
    return link_for_store(store, name, make_ns, opts)


def link_for_store(store: KVStore, name: str, make_ns: Callable[[str], Namespace],
                   opts: StoreOptions = StoreOptions()) -> KVStoreLink:
    """The link to an open ``store`` for the namespace ``make_ns(tenant)``, the tenant being
    the one the store's credentials map to. A store that cannot say it now is asked again
    for ``opts.identity_wait_s`` (a daemon still starting), with one warning. Past that the
    engine starts with tenant ``""`` and the link asks again before each call: a store
    that then names another tenant (a daemon with auth refuses the namespaces built for
    ``""``) is warned about once and no longer called (restart the engine to use it)."""
    failed: tuple[str, Exception] | None = None
    check: Callable[[float], str] | None = None
    try:
        try:
            tenant = ask_tenant(store, name, opts)
        except StoreUnavailable as e:
            tenant, failed = "", ("tenant", e)
            check = lambda timeout_s: store_tenant(store, timeout_s)  # noqa: E731
        ns = make_ns(tenant)
    except BaseException:
        store.close()
        raise
    return KVStoreLink(store, ns, name, timeout_s=opts.call_timeout_s, failed_call=failed,
                       tenant_check=check, warned=opts.identity_wait_s > 0)


def ask_tenant(store: KVStore, name: str, opts: StoreOptions) -> str:
    """``store_tenant``, asked again (backing off) for up to ``opts.identity_wait_s`` while
    the store is unreachable; raises its last ``StoreUnavailable`` after that.

    The window ends with a real attempt: a client whose circuit breaker is open skips
    the call (``CircuitOpen``, nothing sent), and its last real failure inside the
    window opens the breaker past the window's end (a 2 s cool-down: the ask at the
    deadline was always a skip, so a daemon up in the window's last ~2 s was never
    asked). Past the deadline, skips are therefore retried (every ``_SKIP_POLL_S``) until
    the breaker lets one call through, for at most ``opts.call_timeout_s``."""
    deadline = time.monotonic() + opts.identity_wait_s
    delay = 0.2
    while True:
        try:
            return store_tenant(store, opts.call_timeout_s)
        except StoreUnavailable as e:
            left = deadline - time.monotonic()
            if left <= 0:
                if not isinstance(e, CircuitOpen) or -left >= opts.call_timeout_s:
                    raise
                time.sleep(_SKIP_POLL_S)
                continue
            if delay == 0.2:  # the outage's one warning (the link adds none)
                log.warning("kv store %s is unreachable (%s: %s); asking it for its tenant "
                            "again for up to %.0f s, then before each call; its blocks count "
                            "as misses while it fails", name, type(e).__name__,
                            " ".join(str(e).split()), left)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)
