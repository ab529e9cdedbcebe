"""fio as the benches' peer: one fio run's throughput and latency (``run_job`` and
``rates`` for the SSD and shared-FS benches), the file laid out before any measured
round, quiet between cases, and rounds in which every run of ours is bracketed by its
fio peer (``bracketed_rounds``).

Why bracketed: this virtual disk's rate moves by tens of percent from one 1.5 s run to
the next (fio alone, back to back on one file: 895–1430 MB/s in one set of ten,
969–1593 in another). With one fio run per round, a round's ratio compared our run
with a fio run up to a few cases away, so it carried that drift whole (per-round
ratios 0.72–1.01 for one code). A peer run right before and right after each of ours,
and the ratio taken against their mean, cancels drift that is linear over the three
runs; more rounds (the SSD bench's default is 11) average out the rest.

Why strictly alternating (``P A P B P A …``, one chain over all rounds): this disk also
favours a file that was read less often. Rounds of ``P A P B P`` (the peer read three
times a round, our store twice, and ``P P`` at every round's boundary) put our get at
1.41–1.56× fio — and with the roles swapped (fio in the middle, our get bracketing it)
fio came out 1.33× our get: the case in the middle won either way. The old scheme
(``A B P``, our store read twice as often as fio's file) leaned the other way. With the
runs alternating, each file is read every other run, whoever is ours. Both figures stay
visible: the ratio of the medians, and the median of the per-round ratios with their
range.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def fio(
    path: Path | Sequence[Path],
    rw: str,
    bs: int,
    qd: int,
    size: int,
    seconds: float,
    *,
    batch: bool = False,
    huge: bool = False,
) -> dict[str, float]:
    """fio on ``path`` (or on several files, ``size`` bytes over all of them, each I/O at
    a random offset of the next file in turn); ``batch``: ``qd`` I/Os (writes with their
    fdatasync) go in together and all complete before the next batch — the shape of one
    caller's get or put of ``qd`` blocks, whose queue drains at the end of each call.
    ``huge``: fio's buffers on huge pages (``--iomem=shmhuge``; ``hugetlb_pages`` must
    have reserved them), to match rows of ours on huge pages — on this virtual disk the
    buffer's physical contiguity moves the rate by up to 2× (``kvstore.buffers``)."""
    depth = qd + 1 if batch and rw == "randwrite" else qd
    args = [
        "fio",
        "--name=b",
        f"--filename={filename_arg(path)}",
        f"--size={size}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--iodepth={depth}",
        "--ioengine=io_uring",
        "--direct=1",
        f"--runtime={runtime_arg(seconds)}",
        "--time_based",
        "--norandommap",
        "--randrepeat=0",
        "--output-format=json",
    ]
    if rw == "randwrite":
        args.append(f"--fdatasync={qd}")
    if batch:
        args += [f"--iodepth_batch_submit={depth}", f"--iodepth_batch_complete_min={depth}"]
    if huge:
        args.append("--iomem=shmhuge")
    mbps, p50_ns, p99_ns = rates(run_job(args), rw)
    return {"MBps": mbps, "p50_us": p50_ns / 1e3, "p99_us": p99_ns / 1e3}


def filename_arg(path: Path | Sequence[Path]) -> str:
    """fio's ``--filename``: several files joined by ``:``, a ``:`` inside a name escaped."""
    paths = [path] if isinstance(path, Path) else list(path)
    if not paths:
        raise ValueError("fio needs at least one file")
    return ":".join(str(p).replace(":", "\\:") for p in paths)


def run_job(args: list[str]) -> dict[str, Any]:
    """Run fio (``args`` with ``--output-format=json``); its first job's report."""
    done = subprocess.run(args, capture_output=True, text=True)
    out = done.stdout
    try:
        job: dict[str, Any] = json.loads(out[out.index("{") :])["jobs"][0]
    except (ValueError, KeyError, IndexError):
        job = {"error": done.returncode or -1}
    if job.get("error"):
        raise RuntimeError(f"fio failed ({job['error']}): {done.stderr.strip()[-300:]}")
    # A whole report is a finished run: fio 3.33 can abort at exit after it (a double
    # free once its ``--iomem=shmhuge`` buffers are released, at some depths).
    return job


def rates(job: dict[str, Any], rw: str) -> tuple[float, float, float]:
    """A job's MB/s and median and 99th-percentile completion latency (ns) for ``rw``."""
    j = job["read" if rw == "randread" else "write"]
    pct = j["clat_ns"].get("percentile", {})
    return j["bw_bytes"] / 1e6, pct.get("50.000000", 0), pct.get("99.000000", 0)


def runtime_arg(seconds: float) -> str:
    """fio's ``--runtime`` in milliseconds: a bare ``1.5`` is read as whole seconds (fio
    ran 1.0 s against our 1.5 s, and a case that starts on a rested disk gets a larger
    share of its burst in a shorter run)."""
    return f"{round(seconds * 1000)}ms"


def lay_out(path: Path, size: int) -> None:
    """Have fio create its file now, so no measured round pays for the layout."""
    subprocess.run(
        ["fio", "--name=b", f"--filename={path}", f"--size={size}", "--create_only=1"],
        capture_output=True,
        check=True,
    )


@contextlib.contextmanager
def hugetlb_pages(nbytes: int) -> Iterator[None]:
    """At least ``nbytes`` of 2 MiB huge pages reserved (``vm.nr_hugepages``, root only)
    while the block runs, the old reservation restored after: fio's ``--iomem=shmhuge``
    takes its buffers from them. Raises ``PermissionError`` where it cannot reserve."""
    path = Path("/proc/sys/vm/nr_hugepages")
    before = int(path.read_text())
    want = before + -(-nbytes // (2 << 20))
    path.write_text(f"{want}\n")
    try:
        if int(path.read_text()) < want:
            raise PermissionError(f"only {path.read_text().strip()} huge pages could be reserved")
        yield
    finally:
        path.write_text(f"{before}\n")


def fio_memory_like(stack: contextlib.ExitStack, rows: str, qd: int, block_bytes: int) -> bool:
    """Whether fio's buffers go on huge pages, as ours do with ``rows == "huge"``: then
    enough huge pages for two fio buffers of ``qd + 1`` blocks are reserved on ``stack``
    (``hugetlb_pages``). Where that is refused (not root), it says so and fio keeps its
    malloc'd buffers."""
    if rows != "huge":
        return False
    try:
        stack.enter_context(hugetlb_pages(2 * (qd + 1) * block_bytes + (8 << 20)))
    except OSError as e:
        print(
            f"# fio's buffers stay on 4 KiB pages (no huge pages: {e}); ours are on huge "
            "pages, so the ratios are not like for like"
        )
        return False
    return True


def settle(seconds: float) -> None:
    """Let the disk go quiet between cases: what the last case wrote is flushed first."""
    os.sync()
    time.sleep(seconds)


@dataclass(frozen=True)
class Rounds:
    """What ``bracketed_rounds`` measured: every run's figure per case, in the order run
    (an own case once per round, a peer once before the first run and once after each
    own run), and per own case, peer and round the mean of the two peer runs on either
    side of it."""

    values: dict[str, list[float]]
    brackets: dict[str, dict[str, list[float]]]

    def ratios(self, own: str, peer: str) -> list[float]:
        """``own``'s per-round ratios to the mean of its bracketing ``peer`` runs."""
        return [o / p for o, p in zip(self.values[own], self.brackets[own][peer], strict=True)]

    def median(self, case: str) -> float:
        return statistics.median(self.values[case])


def bracketed_rounds(
    own: dict[str, Callable[[], float]],
    peers: dict[str, Callable[[], float]],
    runs: int,
    settle_s: float,
    settle: Callable[[float], None] = settle,
) -> Rounds:
    """``runs`` rounds (at least 3) in one chain: the peers, then an own case, the peers
    again, the next own case, and so on — ``P A P B P B P A P …`` for own cases A, B
    (the peer group after a round's last case opens the next round), so with one peer
    every other run is the peer's; each own run is compared with the mean of the peer
    runs just before and just after it. Odd rounds take the own cases, and the peers
    within each group, in reverse order, so no case always follows the same neighbour
    (a write leaves the disk busier than a read). ``settle(settle_s)`` runs before
    every case."""
    values: dict[str, list[float]] = {name: [] for name in (*own, *peers)}
    brackets: dict[str, dict[str, list[float]]] = {a: {p: [] for p in peers} for a in own}
    before = _run_group(peers, list(peers), values, settle, settle_s)
    for r in range(max(3, runs)):
        flip = r % 2 == 1
        order: Sequence[str] = list(own)[::-1] if flip else list(own)
        group: Sequence[str] = list(peers)[::-1] if flip else list(peers)
        for a in order:
            settle(settle_s)
            values[a].append(own[a]())
            after = _run_group(peers, group, values, settle, settle_s)
            for p in peers:
                brackets[a][p].append((before[p] + after[p]) / 2)
            before = after
    return Rounds(values, brackets)


def _run_group(
    cases: dict[str, Callable[[], float]],
    order: Sequence[str],
    values: dict[str, list[float]],
    settle: Callable[[float], None],
    settle_s: float,
) -> dict[str, float]:
    got = {}
    for name in order:
        settle(settle_s)
        got[name] = cases[name]()
        values[name].append(got[name])
    return got
