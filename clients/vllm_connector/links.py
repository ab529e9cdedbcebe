"""One store link per process and store URL, shared by the connector's two roles.

With ``distributed_executor_backend="uni"`` vLLM builds the scheduler-side and the
worker-side connector in one process; an embedded store may be opened by one process only
(its SSD directory's lock), so both roles must use one link. The link is
``engine.connector.stores.open_store_link``'s, the one ``kvengine`` uses: every store failure is a
counted miss with one warning, never an error.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

from clients.vllm_connector.config import ConnectorConfig
from engine.connector.store_link import StoreLink
from engine.connector.stores import StoreOptions, open_store_link
from kvstore.keys import Namespace

_lock = threading.Lock()
_links: dict[str, tuple[StoreLink, int]] = {}


def acquire(cfg: ConnectorConfig, make_ns: Callable[[str], Namespace]) -> StoreLink:
    """The process's link to ``cfg.store`` (opened on first use); ``release`` it once."""
    with _lock:
        held = _links.get(cfg.store)
        if held is not None:
            _links[cfg.store] = (held[0], held[1] + 1)
            return held[0]
        opts = StoreOptions(
            dram_bytes=cfg.dram_bytes,
            ssd_capacity_bytes=cfg.ssd_capacity_bytes,
            auth_token_file=cfg.auth_token_file,
            call_timeout_s=cfg.call_timeout_s,
        )
        link = open_store_link(cfg.store, make_ns, opts)
        _links[cfg.store] = (link, 1)
        return link


def release(cfg: ConnectorConfig) -> None:
    """Drop one use; the last one flushes what the store accepted and closes it."""
    with _lock:
        held = _links.get(cfg.store)
        if held is None:
            return
        link, uses = held
        if uses > 1:
            _links[cfg.store] = (link, uses - 1)
            return
        del _links[cfg.store]
    link.close()


@atexit.register
def _close_all() -> None:
    """vLLM may exit without shutting its connectors down (an aborting engine core): what
    the store accepted is still flushed (an embedded store's write-back to its SSD)."""
    with _lock:
        held = [link for link, _ in _links.values()]
        _links.clear()
    for link in held:
        link.close()
