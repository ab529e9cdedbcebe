"""The shared pieces of the benchmarks (``bench/harness.py``) that decide what a command
accepts and what a round measures."""

from __future__ import annotations

import threading
import time

import pytest

from bench.harness import check_callers, profile_args, timed_round


def test_profile_options_refuse_callers_that_do_not_divide_the_depth(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ap = profile_args("What it does.\nMore.", "profile_x", "bench/out/x", 1 << 20, "calls")
    assert check_callers(ap, ap.parse_args(["--qd", "32", "--callers", "4"])) == 8
    for bad in ("3", "0", "-2"):
        with pytest.raises(SystemExit) as e:
            check_callers(ap, ap.parse_args(["--qd", "32", "--callers", bad]))
        assert e.value.code == 2
        assert capsys.readouterr().err == "profile_x: error: --callers must divide --qd\n"


def test_a_timed_round_runs_every_caller_at_once() -> None:
    arrived: list[int] = []
    all_in = threading.Barrier(3, timeout=10)  # breaks unless the three run together

    def loop(k: int) -> None:
        arrived.append(k)
        all_in.wait()
        time.sleep(0.02)

    r = timed_round(loop, 3)
    assert sorted(arrived) == [0, 1, 2]
    assert 0.02 <= r.wall_s < 5
    assert r.user_s >= 0 and r.sys_s >= 0
