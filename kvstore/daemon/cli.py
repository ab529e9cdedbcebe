"""``kvstore serve``: run the cache daemon (DESIGN §9).

Flags may also come from ``--config FILE.toml`` (keys are flag names); sizes and
durations are parsed here, after the config is merged, so ``dram = "8GiB"`` and
``dram = 8589934592`` both work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from kvstore.daemon.config import ClusterLink, DaemonConfig, ServerLimits
from kvstore.errors import InvalidArgument
from kvstore.flags import flag_type
from kvstore.host import memory_size
from kvstore.units import parse_duration, parse_size, parse_timeout


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen", default="127.0.0.1:7420", help="HOST:PORT to serve gRPC on (port 0: any)"
    )
    p.add_argument("--dram", default="8GiB", help="DRAM tier capacity")
    p.add_argument("--ssd-dir", default=None, help="directory of the embedded SSD engine")
    p.add_argument("--ssd-capacity", default=None, help="SSD tier capacity (with --ssd-dir)")
    p.add_argument(
        "--nodes",
        default=None,
        help="storage nodes H:P,… (a TOML array in --config) instead of --ssd-dir",
    )
    p.add_argument(
        "--retention",
        default="72h",
        help="SSD retention of idle blocks (with --nodes: every node must run with it)",
    )
    p.add_argument(
        "--replicas",
        default=None,
        help="with --nodes: copies of each block (default min(2, nodes))",
    )
    p.add_argument(
        "--write-quorum",
        default=None,
        help="with --nodes: acknowledgements a write wants (default: --replicas)",
    )
    p.add_argument("--node-tls", action="store_true", help="with --nodes: reach the nodes over TLS")
    p.add_argument(
        "--node-tls-ca",
        default=None,
        metavar="PEM",
        help="with --nodes: CA that signed the nodes' certificates (implies --node-tls)",
    )
    p.add_argument(
        "--node-token-file",
        default=None,
        help="with --nodes: token presented to the nodes (else $KVSTORE_NODE_AUTH_TOKEN)",
    )
    p.add_argument(
        "--shared-fs",
        default=None,
        metavar="DIR",
        help="a directory on a distributed file system every host mounts (3FS, CephFS, "
        "Lustre, MooseFS, GlusterFS): one cache shared by all daemons pointed at it, "
        "instead of --ssd-dir (storage_nodes/sharedfs/README.md)",
    )
    p.add_argument(
        "--shared-fs-capacity", default=None, help="this daemon's share of --shared-fs"
    )
    p.add_argument(
        "--shared-fs-id",
        default=None,
        help="this daemon's name on the mount, unique and stable (default: the host name)",
    )
    p.add_argument(
        "--max-dirty",
        default=None,
        help="bound on bytes awaiting write-back (default 10%% of DRAM)",
    )
    p.add_argument("--metrics-listen", default=None, help="HOST:PORT for Prometheus metrics")
    p.add_argument(
        "--access-log", default=None, metavar="DIR", help="write the Parquet access log here"
    )
    p.add_argument(
        "--access-log-rotate",
        default="60s",
        help="close and rotate access-log files this often (<= 60s)",
    )
    p.add_argument("--auth-token-file", default=None, help="file of 'token tenant' lines")
    p.add_argument("--tls-cert", default=None, help="PEM certificate chain")
    p.add_argument("--tls-key", default=None, help="PEM private key")
    p.add_argument("--workers", type=int, default=32, help="RPC worker threads")
    p.add_argument(
        "--max-inflight",
        default="1GiB",
        help="bound on the bytes all gRPC-path calls buffer together; beyond it calls are "
        "refused (RESOURCE_EXHAUSTED) and clients retry",
    )
    p.add_argument(
        "--stream-idle-timeout",
        type=flag_type(parse_timeout),
        default="30s",
        help="cancel a Commit/Get stream whose client moves nothing for this long",
    )
    p.add_argument(
        "--no-shm", dest="shm", action="store_false", help="do not offer the shared-memory path"
    )


def config_from_args(args: argparse.Namespace) -> DaemonConfig:
    def size(v: Any) -> int | None:
        return None if v is None else parse_size(v)

    if args.nodes:
        from storage_nodes.cluster.config import parse_nodes

        nodes = parse_nodes(args.nodes)  # "h:p,h:p" on the command line, a list in TOML
    else:
        nodes = ()
    dram_bytes = memory_size("--dram", args.dram)
    return DaemonConfig(
        listen=str(args.listen),
        dram_bytes=dram_bytes,
        ssd_dir=args.ssd_dir,
        ssd_capacity_bytes=size(args.ssd_capacity),
        nodes=nodes,
        shared_fs_dir=args.shared_fs,
        shared_fs_capacity_bytes=size(args.shared_fs_capacity),
        shared_fs_id=args.shared_fs_id,
        retention_s=parse_duration(args.retention),
        max_dirty_bytes=size(args.max_dirty),
        metrics_listen=args.metrics_listen,
        access_log_dir=args.access_log,
        access_log_rotate_s=parse_duration(args.access_log_rotate),
        auth_token_file=args.auth_token_file,
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        workers=int(args.workers),
        shm=bool(args.shm),
        limits=limits_from_args(args),
        cluster=ClusterLink(
            replicas=_count(args.replicas, "--replicas"),
            write_quorum=_count(args.write_quorum, "--write-quorum"),
            tls=bool(args.node_tls or args.node_tls_ca),
            tls_ca_file=args.node_tls_ca,
            token_file=args.node_token_file,
        ),
    )


def _count(value: Any, flag: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidArgument(f"{flag} must be a positive integer, got {value!r}")
    try:
        n = int(value)
    except ValueError:
        raise InvalidArgument(f"{flag} must be a positive integer, got {value!r}") from None
    if n < 1:
        raise InvalidArgument(f"{flag} must be a positive integer, got {value!r}")
    return n


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    inflight = parse_size(args.max_inflight)
    if inflight <= 0:
        raise InvalidArgument("--max-inflight must be positive")
    return ServerLimits(
        max_request_bytes=min(ServerLimits().max_request_bytes, inflight),
        max_inflight_bytes=inflight,
        stream_idle_timeout_s=float(args.stream_idle_timeout),
    )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.json:
        shown = {k: v for k, v in dataclasses.asdict(config).items() if k != "limits"}
        print(json.dumps({"config": shown}))
    from kvstore.daemon.server import run_daemon

    return run_daemon(config)
