"""The connector's settings: ``kv_connector_extra_config`` of vLLM's ``--kv-transfer-config``.

Read without vLLM (the project's own tests check them). Keys:

- ``store``: ``embedded:DIR`` (DRAM + SSD in the vLLM process; one process per DIR) or
  ``grpc://HOST:PORT`` / ``grpcs://HOST:PORT`` (a ``kvstore serve`` daemon).
- ``dram`` / ``ssd_capacity`` (embedded only): sizes such as ``1GiB``.
- ``auth_token_file`` (grpc): the bearer token (else ``$KVSTORE_AUTH_TOKEN``).
- ``call_timeout_s``: the deadline of one store call; a call past it is a miss.
- ``block_tokens``: the store's block (64, as ``kvengine``; only equal blocks share).
- ``prefix_key_file``: the deployment's prefix key (``kvstore.prefix_key``): chain keys are
  then keyed blake2b, as ``kvengine serve --prefix-key-file`` makes them (same file, same
  keys: the two keep sharing blocks); without it, xxh3 as a single-user ``kvengine``.
- ``kv_transfer_timeout_s``: how long a consumer's request (``do_remote_prefill``) waits
  for the blocks its producer reported before it computes them (``handoff``).

A bad value refuses the connector at start with one line (``ConnectorConfigError``):
an operator's typo is fixed before serving, as ``kvengine serve --kv-store`` does. A store
that is configured right but unreachable is not an error: its blocks are misses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvstore.errors import InvalidArgument
from kvstore.prefix_key import XXH3, PrefixHash, load_prefix_key
from kvstore.units import parse_size

SCHEMES = ("embedded:", "grpc://", "grpcs://")
_KEYS = frozenset(
    {
        "store",
        "dram",
        "ssd_capacity",
        "auth_token_file",
        "call_timeout_s",
        "block_tokens",
        "prefix_key_file",
        "kv_transfer_timeout_s",
    }
)


class ConnectorConfigError(ValueError):
    """A ``kv_connector_extra_config`` the connector cannot run with (one line)."""


@dataclass(frozen=True, slots=True)
class ConnectorConfig:
    store: str
    dram_bytes: int = 1 << 30
    ssd_capacity_bytes: int = 8 << 30
    auth_token_file: str | None = None
    call_timeout_s: float = 5.0
    block_tokens: int = 64
    prefix_hash: PrefixHash = XXH3  # from prefix_key_file
    kv_transfer_timeout_s: float = 10.0

    @property
    def is_embedded(self) -> bool:
        return self.store.startswith("embedded")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> ConnectorConfig:
        extra = dict(extra or {})
        unknown = set(extra) - _KEYS
        if unknown:
            raise ConnectorConfigError(
                f"KVStoreConnector: unknown kv_connector_extra_config keys {sorted(unknown)}; "
                f"known: {sorted(_KEYS)}"
            )
        store = extra.get("store")
        if not isinstance(store, str) or not (store == "embedded" or store.startswith(SCHEMES)):
            raise ConnectorConfigError(
                f"KVStoreConnector: store {store!r}: expected embedded:DIR, grpc://HOST:PORT "
                "or grpcs://HOST:PORT"
            )
        d = cls(store=store)  # the defaults
        try:
            cfg = cls(
                store=store,
                dram_bytes=parse_size(extra.get("dram", d.dram_bytes)),
                ssd_capacity_bytes=parse_size(extra.get("ssd_capacity", d.ssd_capacity_bytes)),
                auth_token_file=extra.get("auth_token_file"),
                call_timeout_s=float(extra.get("call_timeout_s", d.call_timeout_s)),
                block_tokens=int(extra.get("block_tokens", d.block_tokens)),
                kv_transfer_timeout_s=float(extra.get("kv_transfer_timeout_s",
                                                      d.kv_transfer_timeout_s)),
            )
        except (InvalidArgument, TypeError, ValueError) as e:
            raise ConnectorConfigError(f"KVStoreConnector: {e}") from None
        if not (0 < cfg.call_timeout_s < math.inf and 0 < cfg.kv_transfer_timeout_s < math.inf
                and cfg.block_tokens >= 1):
            raise ConnectorConfigError(
                "KVStoreConnector: call_timeout_s, kv_transfer_timeout_s and block_tokens "
                "must be positive and finite"
            )
        if cfg.auth_token_file is not None:
            # Read now so a missing or empty file is one line at start, not a miss per call.
            from kvstore.wire.channel import token_from_file

            try:
                token_from_file(cfg.auth_token_file, "auth_token_file")
            except (OSError, ValueError) as e:
                raise ConnectorConfigError(f"KVStoreConnector: {e}") from None
        key_file = extra.get("prefix_key_file")
        if key_file is not None:
            try:
                secret = load_prefix_key(str(key_file))
            except InvalidArgument as e:
                raise ConnectorConfigError(f"KVStoreConnector: {e}") from None
            cfg = replace(cfg, prefix_hash=PrefixHash("blake2b_128", secret))
        return cfg
