"""``kvstore stats``: print a running daemon's statistics (text, or ``--json``)."""

from __future__ import annotations

import argparse
import json

from clients.config import ClientConfig, parse_store_url, read_token
from clients.sync_client import GrpcStore
from kvstore.flags import flag_type
from kvstore.tier import StoreStats
from kvstore.units import format_bytes, parse_timeout


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store", default="grpc://127.0.0.1:7420", help="grpc://HOST:PORT or grpcs://HOST:PORT"
    )
    p.add_argument("--auth-token-file", default=None, help="token file (else $KVSTORE_AUTH_TOKEN)")
    p.add_argument("--tls-ca", default=None, help="CA certificate (PEM) for grpcs://")
    p.add_argument(
        "--timeout",
        type=flag_type(parse_timeout),  # nan or inf would reach gRPC as the deadline
        default="5s",
        help="how long to wait for the daemon (e.g. 5s, 2m; a bare number is seconds)",
    )


def render(st: StoreStats) -> str:
    lines = []
    for t in st.tiers:
        if t.info.get("held") == "unknown":  # a tenant's view of a tier that cannot count
            size = format_bytes(t.capacity_bytes)
            lines.append(f"{t.name}: this tenant's share not counted by the tier, of {size}")
            continue
        pct = 100.0 * t.used_bytes / t.capacity_bytes if t.capacity_bytes else 0.0
        lines.append(
            f"{t.name}: {format_bytes(t.used_bytes)} of "
            f"{format_bytes(t.capacity_bytes)} ({pct:.1f}%)"
        )
        for c in t.size_classes:
            lines.append(
                f"  {format_bytes(c.block_bytes)} blocks: {c.used_blocks} of {c.capacity_blocks}"
            )
        for k in sorted(t.counters):
            lines.append(f"  {k} = {t.counters[k]}")
    lines.append("store:")
    for k in sorted(st.counters):
        lines.append(f"  {k} = {st.counters[k]}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    target, tls = parse_store_url(args.store)
    config = ClientConfig(
        target=target,
        tls=tls,
        tls_ca_file=args.tls_ca,
        auth_token=read_token(args.auth_token_file, "--auth-token-file"),
        default_timeout_s=args.timeout,
        shm="off",
    )
    with GrpcStore(config) as store:
        st = store.stats(timeout_s=args.timeout)
    print(json.dumps(st.to_dict(), indent=2, sort_keys=True) if args.json else render(st))
    return 0
