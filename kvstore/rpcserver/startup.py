"""What ``kvstore serve`` and ``kvstore node`` check before they start: every way a flag
can be wrong for this machine becomes one ``InvalidArgument`` line (exit 2), never a
traceback — a busy or unresolvable address, a certificate that is not PEM, a directory
that is a file, a size past what counters can carry (memory: ``kvstore.host``).
"""

from __future__ import annotations

import os
import socket
import ssl
from pathlib import Path
from typing import Protocol

import grpc

from kvstore.errors import InvalidArgument

#: Sizes travel as int64 counters and uint64 fields; past this, Stats cannot carry them.
MAX_CAPACITY_BYTES = (1 << 63) - 1


def check_hostport(flag: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(f"{flag} must be HOST:PORT, got {value!r}")


def check_capacity(flag: str, nbytes: int) -> None:
    if not 0 < nbytes <= MAX_CAPACITY_BYTES:
        raise InvalidArgument(f"{flag} must be in (0, 2**63) bytes, got {nbytes}")


def check_directory(flag: str, path: str | Path | None) -> None:
    """A directory to create or reuse: refuse a path that exists and is something else."""
    if path is not None and os.path.exists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"{flag} {path} exists and is not a directory")


def server_credentials(
    cert_file: str | None, key_file: str | None
) -> grpc.ServerCredentials | None:
    """TLS credentials from PEM files, checked to be a certificate chain and its key (gRPC
    would accept garbage and then fail to bind, which reads as a busy port)."""
    if not cert_file or not key_file:
        return None
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_file, key_file)
        with open(cert_file, "rb") as f:
            cert = f.read()
        with open(key_file, "rb") as f:
            key = f.read()
    except ssl.SSLError as e:  # an OSError too: first
        why = f" ({e.reason})" if e.reason else ""
        raise InvalidArgument(
            f"--tls-cert/--tls-key: not a PEM certificate chain and its private key{why}"
        ) from None
    except OSError as e:
        name = getattr(e, "filename", None) or cert_file
        raise InvalidArgument(f"--tls-cert/--tls-key: cannot read {name}: {e.strerror}") from None
    return grpc.ssl_server_credentials([(key, cert)])


def bind(server: grpc.Server, listen: str, creds: grpc.ServerCredentials | None) -> int:
    """Add the listening port; the bound port number (``listen`` may say port 0)."""
    probe_listen("--listen", listen)
    try:
        port = (
            server.add_insecure_port(listen)
            if creds is None
            else server.add_secure_port(listen, creds)
        )
    except RuntimeError:
        port = 0
    if port == 0:
        raise InvalidArgument(
            f"--listen {listen}: cannot listen there (port in use, or not an address of this host)"
        )
    return port


def probe_listen(flag: str, listen: str) -> None:
    """Try the address with a plain socket first, so a busy port or a host that is not
    ours is one clear line (gRPC's own failure is a log line of its core, then a vague
    error). Port 0 cannot be busy."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise InvalidArgument(f"{flag} {listen}: cannot resolve {host!r} ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise InvalidArgument(f"{flag} {listen}: cannot listen there ({e.strerror})") from None


class MetricsServer(Protocol):
    def serve(self, listen: str) -> int: ...


def serve_metrics(metrics: MetricsServer, listen: str) -> int:
    try:
        return metrics.serve(listen)
    except OSError as e:  # socket.gaierror included
        raise InvalidArgument(
            f"--metrics-listen {listen}: cannot listen there ({e.strerror or e})"
        ) from None
