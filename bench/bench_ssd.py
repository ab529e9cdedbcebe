"""SSD engine throughput against fio on the same file system (issue "SSD engine", item 8).

For 64 KiB, 256 KiB and 2 MiB blocks at queue depth 1 and 32:

* get: ``SSDTier.get_into`` of ``qd`` random stored blocks per call (one io_uring
  submission of ``qd`` O_DIRECT reads, each slot's payload straight into its destination
  row, header and checksum verified there) vs
  ``fio --rw=randread --ioengine=io_uring --direct=1 --iodepth=qd``;
* put: ``SSDTier.put`` of ``qd`` new blocks per call (one group commit: ``qd`` writes, one
  fdatasync per slab touched, one LMDB commit; the store is full, so each put also
  evicts; the commit's checksums passed in, as the write-back does) vs two fio figures:
  ``fio_write`` = ``fio --rw=randwrite --direct=1 --iodepth=qd --fdatasync=qd`` (the
  reference the issue names: one fdatasync per ``qd`` writes, but fio's io_uring engine
  queues the sync like any write, without a drain, so the queue never empties and the
  sync overlaps the next writes) and ``fio_write_batch`` = the same plus
  ``--iodepth=qd+1 --iodepth_batch_submit=qd+1 --iodepth_batch_complete_min=qd+1``:
  ``qd`` writes and their fdatasync submitted together and all completed before the next
  batch — a put's own shape, since a put acknowledges only once its writes are durable
  (fio still lets that sync run beside its batch's writes; a put orders it after them).

fio runs on the store's own slab files (the fill writes whole slabs, so every byte fio
reads is a written block): the same region of the disk as ours, since this virtual
disk's rate depends on where it reads and writes (fio writing its own 1 GiB file ran
0.87-0.90x fio writing the store's files, alternating). fio's writes overwrite stored
blocks, so every get phase runs before the first put phase. ``--fio-own-file``: fio on
a file of its own, laid out before the first round (the figures before the seventh stop).

``--callers N`` (e.g. ``1,2``): N threads each issue calls of ``qd/N`` blocks, so at most
``qd`` I/Os are in flight — what fio's ``--iodepth`` means; with one caller of ``qd``
blocks the device's queue drains at the end of every call by construction (fio's never
drains), with two a call's writes and sync overlap the other caller's.

Caller rows are page aligned (``--unaligned``: 64 bytes off, which forces a staging
copy) and, by default, on huge pages (``--rows huge``: ``kvstore.buffers.io_buffer``, as
the DRAM tier's pool and the engine's load rows are) with fio's buffers on huge pages too
(``--iomem=shmhuge``; the bench reserves ``vm.nr_hugepages`` for the run, as root) —
this virtual disk moves a request's memory one physically contiguous segment at a time,
so 4 KiB pages cost up to half the rate, fio's as ours. ``--rows shared``: rows on 4 KiB
pages of shared memory (the daemon's segment), fio on its malloc'd buffers.
Figures are MB/s of payload (our slots also carry a 4 KiB header page), medians
of ``--runs`` rounds (default 11); latency is per call for us (``qd`` blocks) and per
I/O for fio. Rounds (``bench.fio.bracketed_rounds``): our runs and fio's strictly
alternate (fio, ours, fio, ours, …, one chain over all rounds), and each run of ours is
compared with the mean of the fio runs just before and after it — this virtual disk's
rate moves by tens of percent from one 1.5 s run to the next (the neighbours cancel the
drift), and it favours a file read less often (so each file is read every other run).
Each row gives the ratio of the medians and the median of the per-round ratios with
their range (and every one of them). Fairness: odd rounds run our cases in reverse order; and
every case starts after a ``sync`` and ``--settle-s`` of quiet, so a write burst still
draining in the virtual disk's host does not land on the next case.
Run: ``.venv/bin/python -m bench.bench_ssd`` (``--quick``: one size, short runs;
``--ops get`` or ``--ops put``: one operation and its fio peer only; ``--batch-peer``:
put also against ``fio_write_batch``, get against ``fio_read_batch`` — ``qd`` reads
submitted together and all completed before the next batch, one caller's get shape).
The fio runner is ``bench.fio``.
Needs ``fio`` (``apt-get install -y fio``); without it only our figures are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.fio import bracketed_rounds, fio, fio_memory_like, lay_out
from bench.harness import machine
from bench.ssd_store import ROWS, Ours

SIZES = (64 << 10, 256 << 10, 2 << 20)
QDS = (1, 32)


def compare(
    ours: Ours, fio_file: Path | None, bs: int, qd: int, op: str, a: argparse.Namespace
) -> list[dict]:
    """Ours and fio at one size and depth for ``op`` (get or put), each run of ours
    bracketed by fio's (``bench.fio.bracketed_rounds``); one row per caller count and
    peer."""
    runs: dict[str, list[dict[str, float]]] = {}

    def case(name: str, fn: Callable[[], dict[str, float]]) -> Callable[[], float]:
        def run() -> float:  # keep full results, hand MB/s to the rounds
            r = fn()
            runs.setdefault(name, []).append(r)
            return r["MBps"]

        return run

    own: dict[str, Callable[[], float]] = {}
    for c in a.callers:
        fn = ours.get if op == "get" else ours.put
        own[f"{op}{c}"] = case(f"{op}{c}", partial(fn, qd, a.seconds, c))
    peers: dict[str, Callable[[], float]] = {}
    # By default fio reads and writes the store's own slab files: the same blocks of the
    # disk as ours, so whatever the virtual disk does by region hits both alike (its
    # writes overwrite stored blocks: every get phase runs before the first put phase).
    where: Path | list[Path] | None = fio_file
    size = a.ws
    if fio_file is not None and not a.fio_own_file:
        where, size = ours.slab_files, len(ours.slab_files) * ours.slab_bytes
    if where is not None:
        name, rw = ("fio_read", "randread") if op == "get" else ("fio_write", "randwrite")
        for batch in (False, True) if a.batch_peer else (False,):
            peer = f"{name}_batch" if batch else name
            peers[peer] = case(
                peer,
                partial(fio, where, rw, bs, qd, size, a.seconds, batch=batch, huge=a.fio_huge),
            )
    got = bracketed_rounds(own, peers, a.runs, a.settle_s)
    lat = {
        k: {m: statistics.median(r[m] for r in v) for m in ("p50_us", "p99_us")}
        for k, v in runs.items()
    }
    rows = []
    pairs = [
        (kind, c, peer)
        for c in a.callers
        for kind, peer in [
            ("get", "fio_read"),
            ("get", "fio_read_batch"),
            ("put", "fio_write"),
            ("put", "fio_write_batch"),
        ]
        if kind == op and (peer in peers or (not peers and not peer.endswith("_batch")))
    ]
    for kind, c, peer in pairs:
        name = f"{kind}{c}"
        row = {
            "op": kind,
            "callers": c,
            "block": f"{bs >> 10} KiB",
            "qd": qd,
            "rounds": len(got.values[name]),
            "MBps": round(got.median(name), 1),
            "p50_us": round(lat[name]["p50_us"]),
            "p99_us": round(lat[name]["p99_us"]),
        }
        if kind == "put":  # data sync rounds per put call (fio: one fdatasync per qd writes)
            row["sync_rounds_per_call"] = round(
                statistics.median(r["sync_rounds_per_call"] for r in runs[name]), 2
            )
        if peer in peers:
            ratios = got.ratios(name, peer)
            row.update(
                vs=peer,
                fio_MBps=round(got.median(peer), 1),
                fio_p50_us=round(lat[peer]["p50_us"]),
                fio_p99_us=round(lat[peer]["p99_us"]),
                ratio=round(got.median(name) / got.median(peer), 2),
                # each round's run of ours against the mean of the fio runs either side
                round_ratio=round(statistics.median(ratios), 2),
                round_range=[round(min(ratios), 2), round(max(ratios), 2)],
                round_ratios=[round(x, 2) for x in ratios],
            )
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("bench/out/ssd"))
    ap.add_argument("--ws", type=int, default=1 << 30, help="bytes stored per size")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument(
        "--runs", type=int, default=11, help="rounds (at least 3); figures are their medians"
    )
    ap.add_argument(
        "--settle-s", type=float, default=0.5, help="quiet time (after a sync) before each case"
    )
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default=None, help="block sizes in KiB, e.g. 256 or 64,2048")
    ap.add_argument("--qds", default=None, help="queue depths, e.g. 32 or 1,32")
    ap.add_argument(
        "--index-durability", default="fast", choices=("fast", "strict"), help="SSD index mode"
    )
    ap.add_argument(
        "--unaligned",
        action="store_true",
        help="caller rows 64 bytes off a page boundary (forces the staging copy)",
    )
    ap.add_argument(
        "--rows",
        choices=ROWS,
        default="huge",
        help="the memory of the rows ours read into and write from: huge (io_buffer: the "
        "DRAM tier's pool, the engine's load rows; fio then gets huge-page buffers too, "
        "--iomem=shmhuge, reserving vm.nr_hugepages for the run) or shared (4 KiB pages, "
        "as the daemon's shared-memory segment; fio on malloc'd buffers)",
    )
    ap.add_argument(
        "--no-checksums",
        action="store_true",
        help="put without the commit's checksums (the tier hashes the payloads)",
    )
    ap.add_argument(
        "--callers",
        default="1",
        help="caller threads, e.g. 1,2: each of N callers issues calls of qd/N blocks, so "
        "at most qd I/Os are in flight (fio's --iodepth); 1 drains its queue every call",
    )
    ap.add_argument(
        "--ops",
        default="get,put",
        help="operations to measure, e.g. get (with fio_read as its peer) or put (with "
        "fio_write; with --batch-peer also fio_write_batch); default both",
    )
    ap.add_argument(
        "--batch-peer",
        action="store_true",
        help="a second fio peer that drains its queue every qd I/Os, as one caller's call "
        "does: fio_write_batch for put, fio_read_batch for get (fio's file is then read or "
        "written two runs in three, which this disk does not treat like one in two)",
    )
    ap.add_argument(
        "--fio-own-file",
        action="store_true",
        help="fio reads and writes its own laid-out file instead of the store's slab "
        "files (the scheme of the figures before the seventh stop)",
    )
    a = ap.parse_args()
    try:
        a.callers = sorted({int(x) for x in a.callers.split(",")})
        if min(a.callers) < 1:
            raise ValueError
    except ValueError:
        ap.exit(2, f"bench_ssd: error: --callers wants positive integers, got {a.callers!r}\n")
    a.ops = {x.strip() for x in a.ops.split(",")}
    if not a.ops or not a.ops <= {"get", "put"}:
        ap.exit(2, "bench_ssd: error: --ops wants get, put or get,put\n")
    sizes: tuple[int, ...] = (256 << 10,) if a.quick else SIZES
    if a.sizes:
        sizes = tuple(int(x) << 10 for x in a.sizes.split(","))
    qds = tuple(int(x) for x in a.qds.split(",")) if a.qds else QDS
    if any(qd % c for qd in qds for c in a.callers):
        ap.exit(2, "bench_ssd: error: every queue depth must divide by every --callers\n")
    if a.quick:
        a.seconds, a.ws = 0.5, 256 << 20
    have_fio = shutil.which("fio") is not None
    print(
        f"# {machine()}; dir {a.dir.resolve()}; fio {'yes' if have_fio else 'NOT INSTALLED'}; "
        f"load average at start {os.getloadavg()[0]:.1f}"
    )
    with contextlib.ExitStack() as stack:
        a.fio_huge = have_fio and fio_memory_like(stack, a.rows, max(qds), max(sizes))
        print(f"# caller rows: {a.rows}; fio's buffers: {'huge pages' if a.fio_huge else 'malloc'}")
        rows = measure(a, sizes, qds, have_fio)
    shutil.rmtree(a.dir, ignore_errors=True)
    print_table(rows)
    return 0


def measure(
    a: argparse.Namespace, sizes: tuple[int, ...], qds: tuple[int, ...], have_fio: bool
) -> list[dict]:
    rows = []
    for bs in sizes:
        ours = Ours(
            a.dir / f"store-{bs >> 10}k",
            bs,
            a.ws,
            a.backend,
            a.index_durability,
            a.unaligned,
            rows=a.rows,
        )
        ours.pass_checksums = not a.no_checksums
        fio_file = a.dir / f"fio-{bs >> 10}k" if have_fio else None
        if fio_file is not None and a.fio_own_file:
            lay_out(fio_file, a.ws)
        for op in ("get", "put"):  # every get first: fio's writes overwrite stored blocks
            for qd in qds if op in a.ops else ():
                for row in compare(ours, fio_file, bs, qd, op, a):
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        info = ours.close()
        print(f"# {bs >> 10} KiB: io_backend={info['io_backend']} direct_io={info['direct_io']}")
        if fio_file is not None:
            fio_file.unlink(missing_ok=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print(
        "\n| op | callers | block | qd | ours MB/s | p50/p99 µs (call) | vs | fio MB/s "
        "| fio p50/p99 µs (I/O) | ratio | per-round ratio, median [min–max] |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['op']} | {r['callers']} | {r['block']} | {r['qd']} | {r['MBps']} "
            f"| {r['p50_us']}/{r['p99_us']} "
            f"| {r.get('vs', '—')} | {r.get('fio_MBps', '—')} "
            f"| {r.get('fio_p50_us', '—')}/{r.get('fio_p99_us', '—')} "
            f"| {r.get('ratio', '—')} | {r.get('round_ratio', '—')} "
            f"[{'–'.join(str(x) for x in r.get('round_range', ['—']))}] |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
