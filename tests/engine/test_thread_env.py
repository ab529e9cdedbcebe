"""``engine.thread_env``: the entry point starts torch's OpenMP runtime with a short
spin (``GOMP_SPINCOUNT=10000``) unless the user chose a wait policy. Checked on a real
process: libgomp prints the values it read at load time (``OMP_DISPLAY_ENV=VERBOSE``); its
spin count says which policy it runs (default 300000, passive 0, active ~3e10)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.thread_env import THREAD_ENV_DEFAULTS, set_thread_env_defaults

REPO = Path(__file__).resolve().parents[2]
POLICY_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def test_defaults_fill_an_empty_environment() -> None:
    env: dict[str, str] = {}
    assert set_thread_env_defaults(env) == THREAD_ENV_DEFAULTS == env


@pytest.mark.parametrize("var,value", [("OMP_WAIT_POLICY", "ACTIVE"),
                                       ("OMP_WAIT_POLICY", "PASSIVE"),
                                       ("GOMP_SPINCOUNT", "300000")])
def test_a_policy_the_user_set_wins(var: str, value: str) -> None:
    env = {var: value}
    assert set_thread_env_defaults(env) == {}
    assert env == {var: value}


def _spincount(code: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in POLICY_VARS}
    env.update(extra, OMP_DISPLAY_ENV="VERBOSE", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    (line,) = [x for x in done.stderr.splitlines() if "GOMP_SPINCOUNT" in x]
    return line.split("=")[1].strip().strip("'")


def test_the_entry_point_sets_it_before_torch_loads() -> None:
    assert _spincount("import torch") == "300000"  # libgomp's own default: it spins
    assert _spincount("import engine.cli, torch") == "10000"  # a short spin, then sleep
    assert _spincount("import engine.cli, torch", OMP_WAIT_POLICY="ACTIVE") != "0"
