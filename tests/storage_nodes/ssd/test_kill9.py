"""Crash safety (c): >= 20 seeded SIGKILLs of a writer subprocess at random moments
(half of them with a second thread putting, so group commits overlap at the kill).

The same directory survives every kill. After each, the directory is reopened (the
kernel dropped the dead writer's flock) — every other time as after a reboot, which
rebuilds the index from the slot headers — every indexed key must read back exactly,
``check_integrity`` must pass, and with a capacity that never evicts, every put the
writer saw acknowledged must still be there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from storage_nodes.ssd import SSDTier
from storage_nodes.ssd.marker import read_boot_id
from tests.io_backends import backends_here
from tests.storage_nodes.ssd.helpers import SLAB, make_config, paged_ns, small_ns, verify_all

REPO = Path(__file__).resolve().parents[3]
KILLS = 12  # per packed test (24 kills), half that per paged one (12 more)


@pytest.mark.slow
@pytest.mark.parametrize("evicting", [False, True], ids=["roomy", "evicting"])
@pytest.mark.parametrize("layout", ["packed", "paged"])
def test_sigkill_writer(tmp_path: Path, evicting: bool, layout: str) -> None:
    """``paged``: 8 KiB blocks in page-aligned rows, written and read zero-copy."""
    ns = paged_ns() if layout == "paged" else small_ns()
    d = tmp_path / "ssd"
    acked_path = tmp_path / "acked"
    # 16 salts x 32 blocks fit in 16 slabs of 4 KiB slots (48 of the paged 12 KiB slots)
    cap = (2 if evicting else 16 * (3 if layout == "paged" else 1)) * SLAB
    rng = random.Random(20240 + evicting)
    backends = backends_here()
    for i in range(KILLS if layout == "packed" else KILLS // 2):
        backend = backends[i % len(backends)]
        args = [
            sys.executable,
            "-m",
            "tests.storage_nodes.ssd.writer_proc",
            str(d),
            str(rng.randrange(1 << 30)),
            backend,
            str(cap),
            str(acked_path),
            layout,
            str(1 + (i // 2) % 2),  # putters: kills 2, 3, 6, 7, ... with two at once
        ]
        p = subprocess.Popen(
            args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            line = p.stdout.readline() if p.stdout else ""
            assert line.strip() == "ready", p.stderr.read() if p.stderr else line
            time.sleep(rng.uniform(0.02, 0.5))
            assert p.poll() is None, f"writer exited early ({p.returncode}): {p.stderr.read()}"
            os.kill(p.pid, signal.SIGKILL)
        finally:
            p.wait(timeout=30)
        assert p.returncode == -signal.SIGKILL
        # Every other kill is reopened as after a reboot (another boot id): the index,
        # written without syncs, is then rebuilt from the slot headers, and must come
        # back just as complete as the one the page cache kept.
        reboot = i % 2 == 1
        boot = f"after-kill-{i}" if reboot else read_boot_id()
        t = SSDTier(make_config(d, capacity_bytes=cap, boot_id=boot.strip))
        try:
            assert (t.rebuild_report is not None) == reboot
            t.register(ns)
            t.check_integrity()
            verify_all(t, ns)
            assert t.stats().counters["corrupt_blocks_total"] == 0
            if not evicting:
                acked = {bytes.fromhex(x) for x in acked_path.read_text().split()}
                missing = acked - set(t.iter_keys(ns))
                assert not missing, f"kill {i}: {len(missing)} acknowledged blocks lost"
        finally:
            t.close()
