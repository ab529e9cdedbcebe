"""``kvstore node``: run a storage node (DESIGN §9).

Flags may come from ``--config FILE.toml``; sizes and durations are parsed after the
merge, so ``capacity = "1TiB"`` and ``capacity = 1099511627776`` both work.
"""

from __future__ import annotations

import argparse
import json

from kvstore.cli import UsageError
from kvstore.units import parse_duration, parse_size
from storage_nodes.node.config import NodeConfig


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen", default="127.0.0.1:7431", help="HOST:PORT to serve gRPC on (port 0: any)"
    )
    p.add_argument("--dir", default=None, help="directory of this node's SSD engine (required)")
    p.add_argument("--capacity", default="1TiB", help="SSD capacity of this node")
    p.add_argument("--retention", default="72h", help="drop blocks idle longer than this")
    p.add_argument(
        "--slab",
        default=None,
        help="SSD slab size (default: the engine's choice from the capacity; "
        "an existing directory keeps its own)",
    )
    p.add_argument(
        "--io-backend",
        default="auto",
        choices=("auto", "uring", "pread"),
        help="SSD I/O path (auto: io_uring where the kernel allows it)",
    )
    p.add_argument("--metrics-listen", default=None, help="HOST:PORT for Prometheus metrics")
    p.add_argument(
        "--auth-token-file",
        default=None,
        help="file of 'token tenant' lines (tenant '*': any namespace, for cache daemons)",
    )
    p.add_argument("--tls-cert", default=None, help="PEM certificate chain")
    p.add_argument("--tls-key", default=None, help="PEM private key")
    p.add_argument("--workers", type=int, default=16, help="RPC worker threads")


def config_from_args(args: argparse.Namespace) -> NodeConfig:
    if not args.dir:
        raise UsageError("--dir is required")
    return NodeConfig(
        dir=args.dir,
        capacity_bytes=parse_size(args.capacity),
        listen=str(args.listen),
        retention_s=parse_duration(args.retention),
        slab_bytes=None if args.slab is None else parse_size(args.slab),
        io_backend=str(args.io_backend),
        metrics_listen=args.metrics_listen,
        auth_token_file=args.auth_token_file,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        workers=int(args.workers),
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.json:
        print(
            json.dumps(
                {"config": {k: str(getattr(config, k)) for k in config.__slots__ if k != "limits"}}
            )
        )
    from storage_nodes.node.server import run_node

    return run_node(config)
