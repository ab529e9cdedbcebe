"""The SSD bench's rounds (``bench.fio.bracketed_rounds``): every run of ours sits
between runs of its peers, and its per-round ratio is taken against exactly those two.
Fake cases stand in for the disk (no fio, no timing): each returns a figure from a
log of what ran, so the order and the arithmetic are checked, not the machine. Also how
several files (the SSD store's slab files) are handed to fio."""

from __future__ import annotations

import os
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.fio import bracketed_rounds, filename_arg, fio


class Disk:
    """Runs cases in order, logging (name, figure); ``rate`` gives each run's figure
    from its position in the log."""

    def __init__(self, rate: Callable[[str, int], float]) -> None:
        self.rate = rate
        self.log: list[tuple[str, float]] = []
        self.settles = 0

    def case(self, name: str) -> Callable[[], float]:
        def run() -> float:
            v = self.rate(name, len(self.log))
            self.log.append((name, v))
            return v

        return run

    def settle(self, seconds: float) -> None:
        assert seconds == 0.25
        self.settles += 1


def _run(disk: Disk, own: list[str], peers: list[str], runs: int):  # type: ignore[no-untyped-def]
    return bracketed_rounds(
        {n: disk.case(n) for n in own},
        {n: disk.case(n) for n in peers},
        runs,
        0.25,
        settle=disk.settle,
    )


def test_each_own_run_is_bracketed_and_odd_rounds_reverse_the_order() -> None:
    disk = Disk(lambda name, i: 1.0)
    _run(disk, ["A", "B"], ["P", "Q"], 2)  # fewer than 3 rounds asked: 3 run
    names = "".join(n for n, _ in disk.log)
    assert names == "PQ" + "APQBPQ" + "BQPAQP" + "APQBPQ"
    assert disk.settles == len(disk.log)


def test_a_linear_drift_of_the_disk_cancels_out_of_the_per_round_ratio() -> None:
    """The disk speeds up 3% with every run; ours does 0.9x whatever the disk does at
    its moment. Against one fio run per round the ratio would wander with the drift."""
    def rate(name: str, i: int) -> float:
        disk_rate = 1000.0 * (1 + 0.03 * i)
        return 0.9 * disk_rate if name.startswith("get") else disk_rate

    got = _run(Disk(rate), ["get1", "get2"], ["fio_read"], 5)
    for own in ("get1", "get2"):
        assert got.ratios(own, "fio_read") == pytest.approx([0.9] * 5)
    assert len(got.values["fio_read"]) == 5 * 2 + 1


def test_with_one_peer_the_peer_and_ours_strictly_alternate() -> None:
    """This disk favours a file read less often: no file may be read twice in a row,
    not even across a round's boundary, and each is read every other run."""
    disk = Disk(lambda name, i: 1.0)
    _run(disk, ["get1", "get2"], ["fio_read"], 11)
    fio_runs = [n == "fio_read" for n, _ in disk.log]
    assert fio_runs == [i % 2 == 0 for i in range(len(disk.log))]
    assert len(disk.log) == 2 * 11 * 2 + 1


@given(
    n_own=st.integers(1, 3),
    n_peers=st.integers(0, 2),
    runs=st.integers(3, 6),
    figures=st.lists(st.floats(1.0, 1e4), min_size=1, max_size=50),
)
def test_brackets_are_the_peer_runs_just_before_and_after(
    n_own: int, n_peers: int, runs: int, figures: list[float]
) -> None:
    own = [f"own{i}" for i in range(n_own)]
    peers = [f"peer{i}" for i in range(n_peers)]
    disk = Disk(lambda name, i: figures[i % len(figures)])
    got = _run(disk, own, peers, runs)
    for name in own + peers:
        assert got.values[name] == [v for n, v in disk.log if n == name]
    for a in own:
        assert len(got.values[a]) == runs
        for p in peers:
            want = []
            for i, (n, v) in enumerate(disk.log):
                if n != a:
                    continue
                before = next(x for m, x in reversed(disk.log[:i]) if m == p)
                after = next(x for m, x in disk.log[i + 1 :] if m == p)
                want.append(v / statistics.mean([before, after]))
            assert got.ratios(a, p) == pytest.approx(want)
    assert got.median(own[0]) == statistics.median(got.values[own[0]])


def test_several_files_go_to_fio_as_one_colon_list_with_colons_in_names_escaped() -> None:
    assert filename_arg(Path("/d/a")) == "/d/a"
    got = filename_arg([Path("/d/slab-00000"), Path("/d/x:y")])
    assert got == "/d/slab-00000:/d/x\\:y"
    with pytest.raises(ValueError):
        filename_arg([])


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_fio_reads_every_file_it_is_given(tmp_path: Path) -> None:
    """One fio run over two files reads both (a file fio never touched would keep its
    access time; fio's own report does not split by file)."""
    files = [tmp_path / "a", tmp_path / "b"]
    for f in files:
        f.write_bytes(os.urandom(1 << 20))
        os.utime(f, (0, 0))
    r = fio(files, "randread", 64 << 10, 4, 2 << 20, 0.2)
    assert r["MBps"] > 0
    assert all(f.stat().st_atime > 0 for f in files)
