"""Client channels and the bearer-token metadata, the same for every client of the protocol
(the sync and asyncio clients, and the cluster's node client)."""

from __future__ import annotations

import ssl

import grpc

from kvstore.errors import InvalidArgument
from kvstore.textfile import read_text
from kvstore.wire.codec import MAX_MESSAGE_BYTES

#: The metadata key every RPC's token travels in, as ``Bearer TOKEN`` (DESIGN §7).
AUTH_KEY = "authorization"
BEARER = "Bearer "

#: Message limits agree with the servers' (``MAX_MESSAGE_BYTES``); reconnect quickly after
#: a server restart (the clients' breakers bound the cost of a dead one).
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)


def token_from_file(path: str, what: str) -> str:
    """The token in the file ``path``: the first field of its first non-comment line (a bare
    token, or a server's ``token tenant`` line). A file that cannot be read or holds no
    token is an ``InvalidArgument`` naming it as ``what`` (the flag that gave it)."""
    for line in read_text(path, what).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line.split()[0]
    raise InvalidArgument(f"{what} {path} holds no token")


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents ``token`` (none without one)."""
    return ((AUTH_KEY, f"{BEARER}{token}"),) if token else ()


def channel_credentials(tls: bool, ca_file: str | None) -> grpc.ChannelCredentials | None:
    """TLS credentials (``ca_file`` as the root, else the system roots), or ``None`` for a
    plaintext channel."""
    if not tls:
        return None
    return grpc.ssl_channel_credentials(read_ca_file(ca_file) if ca_file else None)


def read_ca_file(path: str) -> bytes:
    """The PEM certificates of the CA file ``path``, checked before any channel uses them:
    gRPC takes any bytes, then logs four C-core lines per connection attempt ("Could not
    load any root certificate") and fails each call as if the server were unreachable."""
    text = read_text(path, "TLS CA file")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except (ssl.SSLError, ValueError):  # no certificate in it, or a broken one
        raise InvalidArgument(f"TLS CA file {path}: holds no PEM certificate") from None
    return text.encode()


def open_channel(target: str, *, tls: bool = False, ca_file: str | None = None) -> grpc.Channel:
    """A blocking channel to ``host:port`` with the protocol's options."""
    creds = channel_credentials(tls, ca_file)
    options = list(CHANNEL_OPTIONS)
    if creds is None:
        return grpc.insecure_channel(target, options)
    return grpc.secure_channel(target, creds, options)
