"""Client configuration: the store URL, credentials, deadlines, retries."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import grpc

from clients.breaker import BreakerConfig
from kvstore.errors import InvalidArgument
from kvstore.wire.channel import (
    CHANNEL_OPTIONS,
    bearer_metadata,
    channel_credentials,
    token_from_file,
)

TOKEN_ENV = "KVSTORE_AUTH_TOKEN"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """``target`` is ``host:port``. ``default_timeout_s`` applies when a call passes
    ``timeout_s=None``; retries of UNAVAILABLE happen only inside that deadline.
    ``shm="auto"`` uses the same-host fast path when the daemon's staging segment can
    be mapped; ``"off"`` never does."""

    target: str
    tls: bool = False
    tls_ca_file: str | None = None
    auth_token: str | None = None
    default_timeout_s: float = 10.0
    retry_initial_backoff_s: float = 0.01
    retry_max_backoff_s: float = 0.5
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    shm: str = "auto"
    shm_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.shm not in ("auto", "off"):
            raise InvalidArgument(f"shm must be 'auto' or 'off', got {self.shm!r}")
        if self.default_timeout_s <= 0:
            raise InvalidArgument("default_timeout_s must be positive")

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        return channel_credentials(self.tls, self.tls_ca_file)

    def channel_options(self) -> list[tuple[str, int]]:
        return list(CHANNEL_OPTIONS)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return bearer_metadata(self.auth_token)


def parse_store_url(url: str) -> tuple[str, bool]:
    """``grpc://H:P`` or ``grpcs://H:P`` (TLS) -> (``H:P``, tls)."""
    for scheme, tls in (("grpc://", False), ("grpcs://", True)):
        if url.startswith(scheme):
            target = url[len(scheme) :].rstrip("/")
            host, sep, port = target.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise InvalidArgument(f"store URL {url!r} must be {scheme}HOST:PORT")
            return target, tls
    raise InvalidArgument(f"store URL {url!r} must start with grpc:// or grpcs://")


def read_token(token_file: str | None, what: str = "token file") -> str | None:
    """The token from ``token_file`` (first field of its first non-comment line; the
    daemon's ``token tenant`` file format works too) or from ``$KVSTORE_AUTH_TOKEN``.
    ``what`` is the flag that named the file, for its errors."""
    if token_file:
        return token_from_file(token_file, what)
    return os.environ.get(TOKEN_ENV) or None


def config_from_url(url: str, *, token_file: str | None = None, **kw: object) -> ClientConfig:
    target, tls = parse_store_url(url)
    return ClientConfig(target=target, tls=tls, auth_token=read_token(token_file), **kw)  # type: ignore[arg-type]
