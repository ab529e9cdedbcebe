"""Whose CPU a shared-FS put costs, per process, against fio's writes on the same mount
(a diagnosis; ``bench_sharedfs`` has the ratios, ``profile_sharedfs`` our own phases).

On a 2-core machine a loopback distributed file system is CPU-bound, so a put's
throughput follows the CPU the whole machine spends per call. For each case, interleaved
rounds of ``--seconds``: wall per call of 32 × 256 KiB and CPU per call of every process
by name (``/proc/*/stat``: the file system's master, chunkservers or bricks, its FUSE
client, this process, fio) and of the machine (``/proc/stat``). Cases: our put (a full
store, as in the bench), our put with the manifest's fdatasync skipped (what the frame's
sync still costs), fio ``randwrite`` 256 KiB (the bench's reference), and fio writing
what a put writes per block: 262,208 bytes (header + payload) at 4 KiB-aligned offsets.
fio's own CPU is not listed (it has exited when the round ends; the machine's total
includes it), and its wall includes its start (~0.1 s a round).

Run alone: ``.venv/bin/python -m bench.split_sharedfs_put``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.bench_sharedfs import BLOCK, QD, Ours
from storage_nodes.sharedfs.manifest_log import ManifestLog
from tests.dfs.cluster import start

_TCK = os.sysconf("SC_CLK_TCK")
SLOT_WRITE_BYTES = 64 + BLOCK  # a block's header and payload, written as one transfer


def cpu_by_process() -> dict[str, float]:
    """CPU seconds so far of every process by command name, and of the whole machine."""
    out: dict[str, float] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                s = f.read()
        except OSError:
            continue  # gone meanwhile
        name = "this process" if int(p) == os.getpid() else s[s.index("(") + 1 : s.rindex(")")]
        fields = s[s.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / _TCK
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    out["machine"] = (sum(v) - v[3] - v[4]) / _TCK  # all but idle and iowait
    return out


def fio_calls(path: Path, bs: int, align: int, size: int, seconds: float) -> float:
    """fio randwrite at depth 32 with a fdatasync per 32 writes; returns calls of 32."""
    args = ["fio", "--name=b", f"--filename={path}", f"--size={size}", "--rw=randwrite",
            f"--bs={bs}", f"--blockalign={align}", "--direct=1", f"--runtime={seconds}",
            "--time_based", "--norandommap", "--randrepeat=0", "--output-format=json",
            "--ioengine=libaio", f"--iodepth={QD}", f"--fdatasync={QD}"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out[out.index("{"):])["jobs"][0]["write"]["total_ios"]) / QD


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="moosefs")
    ap.add_argument("--ws", type=int, default=256 << 20)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix=f"split-{a.profile}-"))
    c = start(a.profile, base)
    try:
        ours = Ours(c.mounts[0] / "bench", a.ws, a.profile)
        fio_file = c.mounts[0] / "fio-file"
        fio_calls(fio_file, BLOCK, BLOCK, a.ws, 0.5)  # lay the file out first
        synced = ManifestLog.sync

        def puts(skip_frame_sync: bool) -> float:
            if skip_frame_sync:
                ManifestLog.sync = lambda self, ticket: True  # type: ignore[method-assign]
            try:
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < a.seconds:
                    ours._put_batch()
                    n += 1
                return n
            finally:
                ManifestLog.sync = synced  # type: ignore[method-assign]

        cases: dict[str, Callable[[], float]] = {
            "put": lambda: puts(False),
            "put, frame not synced": lambda: puts(True),
            "fio 256 KiB": lambda: fio_calls(fio_file, BLOCK, BLOCK, a.ws, a.seconds),
            f"fio {SLOT_WRITE_BYTES} B @4 KiB": lambda: fio_calls(
                fio_file, SLOT_WRITE_BYTES, 4096, a.ws, a.seconds),
        }
        for r in range(a.rounds):
            for name, run in cases.items():
                before, w0 = cpu_by_process(), time.perf_counter()
                calls = run()
                wall, after = time.perf_counter() - w0, cpu_by_process()
                per = {k: (after.get(k, 0.0) - before.get(k, 0.0)) * 1e3 / calls
                       for k in after if after.get(k, 0.0) - before.get(k, 0.0) > 1e-3}
                top = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(),
                                                                   key=lambda kv: -kv[1]))
                print(f"round {r + 1} {name}: {wall * 1e3 / calls:.1f} ms per call of {QD} "
                      f"({calls * QD * BLOCK / wall / 1e6:.0f} MB/s); CPU ms per call: {top}",
                      flush=True)
        ours.close()
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
