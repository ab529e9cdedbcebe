"""``kvstore hitrate LOG…``: replay traffic logs through simulated tiers (DESIGN §9, §10).

Values are parsed here rather than by argparse ``type=`` so that bad flags and bad
``--config`` values take the same path: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

from kvstore.eviction import POLICIES
from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.passrun import Method, PassOptions, run_one_pass
from kvstore.hitrate.progress import batch_progress
from kvstore.hitrate.readers import FORMATS, open_inputs
from kvstore.hitrate.replicas import FleetConfig
from kvstore.hitrate.report import Prices, to_json, to_text
from kvstore.hitrate.request import Request
from kvstore.hitrate.routing import ROUTINGS, parse_routings
from kvstore.hitrate.s3replay import run_s3fifo
from kvstore.hitrate.sweep import SweepSpec, parse_sweep
from kvstore.units import parse_capacity, parse_duration


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="trace files, directories or globs")
    parser.add_argument(
        "--format",
        default="auto",
        help=f"input format: auto, {', '.join(FORMATS)} (default: auto-detect)",
    )
    parser.add_argument(
        "--hbm", default="0", help="HBM tier size (bytes, KiB…PiB, Ntok, inf; 0 = absent)"
    )
    parser.add_argument("--dram", default="0", help="DRAM tier size (default 0 = absent)")
    parser.add_argument("--ssd", default="inf", help="SSD tier size (default inf)")
    parser.add_argument("--bytes-per-token", default="890", help="KV bytes per token (default 890)")
    parser.add_argument(
        "--block-tokens",
        default=None,
        help="block size for formats that do not carry one (Mooncake: 512)",
    )
    parser.add_argument("--policy", default="lru", help=f"eviction policy: {', '.join(POLICIES)}")
    parser.add_argument(
        "--retention", default="72h", help="SSD retention in trace time (default 72h)"
    )
    parser.add_argument("--time-scale", default="1", help="multiply trace time by this (default 1)")
    parser.add_argument(
        "--replay-keep",
        default="140",
        help="tokens recomputed on each hit (bounded replay; default 140)",
    )
    parser.add_argument("--price-cached", default="0.003", help="$ per M cached input tokens")
    parser.add_argument("--price-uncached", default="0.15", help="$ per M uncached input tokens")
    parser.add_argument(
        "--prefill-tokens-per-gpu-s", default="9200", help="prefill throughput for GPU-hours saved"
    )
    parser.add_argument(
        "--sweep",
        action="append",
        default=None,
        metavar="TIER=LO..HI:xF",
        help="capacity sweep, e.g. dram=1GiB..1TiB:x2 (repeatable, one per tier; in a"
        " config: a string or a list)",
    )
    parser.add_argument(
        "--plot", metavar="F.png", default=None, help="draw the sweep (needs --sweep)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--exact", action="store_true", help="every block access tracked (the default)"
    )
    mode.add_argument(
        "--sample",
        metavar="RATE",
        default=None,
        help="SHARDS: track only keys hashed under RATE in (0, 1], e.g. 0.01 (lru only)",
    )
    parser.add_argument(
        "--replicas",
        metavar="N",
        default=None,
        help="N engine replicas, each its own hbm, in front of one shared store",
    )
    parser.add_argument(
        "--routing",
        metavar="NAME[,NAME…]",
        default=None,
        help=f"routing(s) to compare with --replicas: {', '.join(ROUTINGS)} (default: all)",
    )
    parser.add_argument(
        "--dram-per-replica",
        action="store_true",
        help="with --replicas: each replica its own --dram (default: one shared DRAM)",
    )
    parser.add_argument(
        "--max-memory",
        metavar="SIZE",
        default=None,
        help="refuse (exit 2) rather than let the replay's stack outgrow SIZE, e.g. 1GiB",
    )


def _number(value: Any, flag: str, cast: Callable[[str], float] = float) -> float:
    try:
        x = cast(str(value).strip().replace("_", ""))
    except ValueError:
        raise ConfigError(f"{flag}: expected a number, got {value!r}") from None
    if isinstance(x, float) and not math.isfinite(x):
        raise ConfigError(f"{flag}: expected a finite number, got {value!r}")
    return x


def _config(args: argparse.Namespace) -> SimConfig:
    if args.policy not in POLICIES:
        raise ConfigError(f"--policy: unknown policy {args.policy!r}; known: {', '.join(POLICIES)}")
    return SimConfig(
        hbm=parse_capacity(args.hbm),
        dram=parse_capacity(args.dram),
        ssd=parse_capacity(args.ssd),
        bytes_per_token=_number(args.bytes_per_token, "--bytes-per-token"),
        policy=args.policy,
        retention_s=parse_duration(args.retention),
        time_scale=_number(args.time_scale, "--time-scale"),
        replay_keep_tokens=int(_number(args.replay_keep, "--replay-keep", int)),
    )


def _prices(args: argparse.Namespace) -> Prices:
    return Prices(
        cached_usd_per_m_tokens=_number(args.price_cached, "--price-cached"),
        uncached_usd_per_m_tokens=_number(args.price_uncached, "--price-uncached"),
        prefill_tokens_per_gpu_s=_number(
            args.prefill_tokens_per_gpu_s, "--prefill-tokens-per-gpu-s"
        ),
    )


def _block_tokens(args: argparse.Namespace) -> int | None:
    if args.block_tokens is None:
        return None
    b = int(_number(args.block_tokens, "--block-tokens", int))
    if b <= 0:
        raise ConfigError(f"--block-tokens must be positive, got {b}")
    return b


def _pass_options(args: argparse.Namespace) -> PassOptions:
    rate = 1.0 if args.sample is None else _number(args.sample, "--sample")
    limit = None
    if args.max_memory is not None:
        cap = parse_capacity(args.max_memory)
        if cap.unbounded or cap.bytes_ is None:
            raise ConfigError(f"--max-memory needs a size in bytes, got {args.max_memory!r}")
        limit = cap.bytes_
    return PassOptions(sample_rate=rate, max_memory_bytes=limit)


def _fleet(args: argparse.Namespace) -> FleetConfig | None:
    """``--replicas`` and its companions; None for a single engine."""
    if args.replicas is None:
        if args.routing is not None:
            raise ConfigError("--routing needs --replicas N")
        if args.dram_per_replica:
            raise ConfigError("--dram-per-replica needs --replicas N")
        return None
    n = int(_number(args.replicas, "--replicas", int))
    for flag, given in (
        ("--sample", args.sample is not None),
        ("--max-memory", args.max_memory is not None),
        ("--plot", args.plot is not None),
    ):
        if given:
            raise ConfigError(f"{flag} does not apply with --replicas (replayed per point)")
    return FleetConfig(replicas=n, dram_per_replica=bool(args.dram_per_replica))


def _show_progress(args: argparse.Namespace) -> bool:
    return not (args.json or args.no_progress or not sys.stderr.isatty())


def _progress(args: argparse.Namespace) -> Callable[[Iterator[Request]], Iterator[Request]]:
    """tqdm on a terminal; nothing (not even the import) otherwise."""
    if not _show_progress(args):
        return lambda it: it

    def wrap(it: Iterator[Request]) -> Iterator[Request]:
        from tqdm import tqdm

        return iter(tqdm(it, unit=" req", unit_scale=True, mininterval=0.5, leave=False))

    return wrap


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    prices = _prices(args)
    specs = [parse_sweep(s) for s in args.sweep or ()]
    tiers = [s.tier for s in specs]
    if len(set(tiers)) != len(tiers):
        raise ConfigError("--sweep: give each tier at most once")
    if args.plot and not specs:
        raise ConfigError("--plot needs --sweep: there is no capacity axis to draw")
    if args.plot and len({s.points[0].bytes_ is None for s in specs}) > 1:
        raise ConfigError("--plot: sweep all tiers in bytes or all in tokens")
    fleet = _fleet(args)
    routings = parse_routings(args.routing) if fleet is not None else ()
    reader = open_inputs(args.logs, fmt=args.format, block_tokens=_block_tokens(args))
    progress = _progress(args)

    def requests() -> Iterator[Request]:
        return progress(reader.requests())

    if fleet is not None:
        return _run_fleet(args, requests, config, prices, fleet, routings, specs)

    options = _pass_options(args)
    if config.policy != "lru" and options.sample_rate < 1:
        raise ConfigError("--sample needs --policy lru (SHARDS samples an LRU stack)")
    if config.policy != "lru" and options.max_memory_bytes is not None:
        raise ConfigError("--max-memory needs --policy lru (it bounds the one-pass stack)")
    points: list = []
    method = None
    how: Method | None = None
    progress_b = batch_progress(reader) if _show_progress(args) else (lambda it: it)
    if config.policy == "lru":
        result, points, how = run_one_pass(reader, config, specs, options, progress_b)
        method = "stack" if specs else None
    else:  # not a stack algorithm: a simulation per point, all from one read (s3replay.py)
        result, points = run_s3fifo(reader, config, specs, progress_b, progress)
        method = "replay" if specs else None
    if result.requests == 0:
        raise ConfigError("the input holds no requests")
    if args.plot:
        from kvstore.hitrate.plot import plot_sweep

        plot_sweep(points, args.plot, title=", ".join(args.logs)[:80])
    if args.json:
        body = to_json(result, config, prices, sweep=points, sweep_method=method)
        if how is not None and how.name == "sampled":
            # Exact runs keep today's shape (loadgen's reports mirror every key of it).
            body["method"] = how.to_dict()
            sweep_rows = cast(list[dict[str, object]], body.get("sweep", []))
            for p, bound in zip(sweep_rows, how.point_error_bounds[1:], strict=False):
                p["error_bound_points"] = bound
        print(json.dumps(body, allow_nan=False))
    else:
        print(to_text(result, config, prices, sweep=points, sweep_method=method))
        if how is not None:
            print(how.text())
    return 0


def _run_fleet(
    args: argparse.Namespace,
    requests: Callable[[], Iterator[Request]],
    config: SimConfig,
    prices: Prices,
    fleet: FleetConfig,
    routings: tuple[str, ...],
    specs: list[SweepSpec],
) -> int:
    from kvstore.hitrate.fleet import run_fleet
    from kvstore.hitrate.fleet_report import fleet_json, fleet_text

    run_ = run_fleet(requests, config, fleet, routings, specs)
    if run_.outcomes[0].result.requests == 0:
        raise ConfigError("the input holds no requests")
    if args.json:
        print(json.dumps(fleet_json(run_, config, prices), allow_nan=False))
    else:
        print(fleet_text(run_, config))
    return 0
