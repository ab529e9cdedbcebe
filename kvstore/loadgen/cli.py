"""``kvstore loadgen TRACE… --store grpc://H:P``: replay a trace against a real store as an
engine would, check every byte read (``--verify``), and compare the hit rate the store
served with what the simulator predicts for its capacities (DESIGN §9).

Exit status: 0 clean; 1 when any byte read back was wrong or an acknowledged durable block
is missing (``--audit-durable``); 2 for bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

from kvstore.errors import StoreUnavailable
from kvstore.flags import flag_type
from kvstore.loadgen.errors import LoadgenError
from kvstore.loadgen.streams import DISPATCHERS
from kvstore.units import parse_size, parse_timeout


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces", nargs="+", metavar="TRACE", help="trace files, directories or globs"
    )
    parser.add_argument(
        "--store",
        default="grpc://127.0.0.1:7420",
        help="grpc://HOST:PORT (the daemon) or 'embedded' (a tier manager in this process)",
    )
    parser.add_argument(
        "--auth-token-file", default=None, help="token for the daemon (or $KVSTORE_AUTH_TOKEN)"
    )
    parser.add_argument("--concurrency", default="1", help="concurrent streams (default 1)")
    parser.add_argument(
        "--streams",
        default="auto",
        help=f"auto, {', '.join(DISPATCHERS)}: spread requests over streams (see README)",
    )
    parser.add_argument(
        "--speed", default="inf", help="pace at SPEED x trace time (default inf: unpaced)"
    )
    parser.add_argument(
        "--bytes-per-token", default="32", help="payload bytes per token (default 32)"
    )
    parser.add_argument("--verify", action="store_true", help="check every byte read back")
    parser.add_argument(
        "--durability", default="dram", help="commit durability: dram (default) or ssd"
    )
    parser.add_argument(
        "--audit-durable",
        action="store_true",
        help="after the replay, read back every block acknowledged with durability ssd",
    )
    parser.add_argument("--requests", default=None, help="replay only the first N requests")
    parser.add_argument("--format", default="auto", help="trace format (default auto-detect)")
    parser.add_argument(
        "--block-tokens", default=None, help="block size for Mooncake (default 512)"
    )
    parser.add_argument(
        "--timeout",
        type=flag_type(parse_timeout),
        default="10s",
        help="deadline of each store call (default 10s)",
    )
    parser.add_argument(
        "--no-shm", action="store_true", help="never use the shared-memory fast path"
    )
    parser.add_argument("--dram", default="1GiB", help="embedded store: DRAM tier size")
    parser.add_argument("--ssd-dir", default=None, help="embedded store: SSD directory")
    parser.add_argument("--ssd-capacity", default=None, help="embedded store: SSD capacity")


def _int(value: Any, flag: str, minimum: int = 1) -> int:
    try:
        n = int(str(value).strip().replace("_", ""))
    except ValueError:
        raise LoadgenError(f"{flag}: expected an integer, got {value!r}") from None
    if n < minimum:
        raise LoadgenError(f"{flag} must be >= {minimum}, got {n}")
    return n


def _speed(value: Any) -> float:
    text = str(value).strip().lower()
    if text in ("inf", "max", "0"):
        return math.inf
    try:
        s = float(text)
    except ValueError:
        raise LoadgenError(f"--speed: expected a number or inf, got {value!r}") from None
    if not s > 0 or math.isnan(s):
        raise LoadgenError(f"--speed must be positive (or inf), got {value!r}")
    return s


def _open_session(args: argparse.Namespace, timeout_s: float) -> Any:
    from kvstore.loadgen.session import StoreSession

    store = str(args.store)
    if store == "embedded":
        from kvstore.embedded import open_embedded
        from kvstore.host import memory_size

        ssd_cap = parse_size(args.ssd_capacity) if args.ssd_capacity else None
        manager = open_embedded(memory_size("--dram", args.dram), args.ssd_dir, ssd_cap)
        return StoreSession(lambda: manager, reopenable=False, timeout_s=timeout_s)
    if args.ssd_dir or args.ssd_capacity:
        raise LoadgenError("--ssd-dir/--ssd-capacity configure --store embedded only")
    from clients.config import config_from_url
    from clients.sync_client import GrpcStore

    cfg = config_from_url(
        store,
        token_file=args.auth_token_file,
        shm="off" if args.no_shm else "auto",
        default_timeout_s=timeout_s,
    )
    return StoreSession(lambda: GrpcStore(cfg), reopenable=True, timeout_s=timeout_s)


def load_config(args: argparse.Namespace) -> Any:
    from kvstore.loadgen.load import LoadConfig

    if args.streams != "auto" and args.streams not in DISPATCHERS:
        raise LoadgenError(
            f"--streams: unknown mode {args.streams!r}; known: auto, {', '.join(DISPATCHERS)}"
        )
    return LoadConfig(
        inputs=tuple(args.traces),
        fmt=args.format,
        block_tokens=None
        if args.block_tokens is None
        else _int(args.block_tokens, "--block-tokens"),
        bytes_per_token=_int(args.bytes_per_token, "--bytes-per-token"),
        concurrency=_int(args.concurrency, "--concurrency"),
        speed=_speed(args.speed),
        streams=str(args.streams),
        verify=bool(args.verify),
        durability=str(args.durability),
        max_requests=None if args.requests is None else _int(args.requests, "--requests"),
        audit=bool(args.audit_durable),
    )


def run(args: argparse.Namespace) -> int:
    from kvstore.loadgen.load import LoadRun
    from kvstore.loadgen.text import to_text

    config = load_config(args)
    if args.audit_durable and config.durability != "ssd":
        raise LoadgenError("--audit-durable needs --durability ssd")
    timeout_s = float(args.timeout)  # finite and positive: flag_type(parse_timeout)
    session = _open_session(args, timeout_s)
    try:
        # A daemon with a token file takes only namespaces of the token's tenant.
        config = dataclasses.replace(config, tenant=session.tenant())
        load = LoadRun(config, session)
        report = load.run()
    except StoreUnavailable as e:
        raise LoadgenError(f"cannot reach the store at {args.store}: {e}") from None
    finally:
        session.close()
    body = report.to_json()
    if args.json:
        print(json.dumps(body, allow_nan=False))
    else:
        print(to_text(body))
    failed = report.wrong_bytes > 0
    audit = load.audit_result
    if audit is not None and (audit.missing or audit.wrong_bytes):
        failed = True
        print(
            f"kvstore loadgen: {audit.missing} blocks acknowledged durable are missing, "
            f"{audit.wrong_bytes} wrong bytes among them",
            file=sys.stderr,
        )
    if report.wrong_bytes:
        first = report.wrong_keys[0]
        print(
            f"kvstore loadgen: FAILED: {report.wrong_bytes} wrong bytes in {report.wrong_blocks} "
            f"blocks, first key {first.key_hex} (namespace {first.namespace})",
            file=sys.stderr,
        )
    return 1 if failed else 0
