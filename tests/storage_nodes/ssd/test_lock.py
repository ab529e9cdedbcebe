"""Exclusive ownership: flock on DIR/LOCK; a second opener gets a one-line error naming
the holder's pid; a SIGKILLed holder leaves nothing locked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage_nodes.ssd import SSDLockedError, SSDTier
from tests.storage_nodes.ssd.helpers import make_config

REPO = Path(__file__).resolve().parents[3]

_HOLDER = """
import sys, time
from storage_nodes.ssd import SSDTier
from tests.storage_nodes.ssd.helpers import make_config
t = SSDTier(make_config(sys.argv[1]))
print("ready", flush=True)
time.sleep(120)
"""


def test_second_opener_in_process(tmp_path: Path) -> None:
    t = SSDTier(make_config(tmp_path / "ssd"))
    with pytest.raises(SSDLockedError) as e:
        SSDTier(make_config(tmp_path / "ssd"))
    msg = str(e.value)
    assert f"pid {os.getpid()}" in msg and "\n" not in msg
    t.close()
    SSDTier(make_config(tmp_path / "ssd")).close()


def test_other_process_holder_is_named_and_sigkill_releases(tmp_path: Path) -> None:
    d = tmp_path / "ssd"
    p = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(d)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        with pytest.raises(SSDLockedError, match=f"in use by pid {p.pid}"):
            SSDTier(make_config(d))
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait(timeout=30)
    SSDTier(make_config(d)).close()
