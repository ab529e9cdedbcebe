"""Every benchmark module still imports after the code it measures moved, and every
benchmark with a command line answers ``--help`` (argparse exits 0 before any work).
The figures themselves are made only by ``make bench`` (never timed here)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__")
# No command line of their own: the runner of all benchmarks, a worker driven over a pipe,
# the shared helpers, bench_router's --pd half and its prediction table, the vLLM peer
# bench_engine drives and the prefill-kernel table bench_kernels times.
NO_CLI = {"run_all", "daemon_bench_worker", "harness", "engine_args", "fio", "ssd_store",
          "router_pd", "router_table", "vllm_peer", "prefill_table"}


@pytest.mark.parametrize("name", MODULES)
def test_the_module_imports(name: str) -> None:
    importlib.import_module(f"bench.{name}")


@pytest.mark.parametrize("name", sorted(set(MODULES) - NO_CLI))
def test_help_exits_cleanly(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--ops", "linears", "--linear-kernels", "onednn,nope"],
                                  ["--ops", "linears,decode"],
                                  ["--ops", "linears", "--linear-rows", "0"]])
def test_bench_kernels_refuses_bad_linear_arguments(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from bench.bench_kernels import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_kernels: ") and err.count("\n") == 1


def test_decode_ab_by_cpu_time_needs_one_compute_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.bench_decode_backends import main

    monkeypatch.setenv("KVENGINE_THREADS", "2")
    assert main(["--model", str(tmp_path), "--linears", "onednn,bf16gemv", "--cpu-time"]) == 2
    assert "KVENGINE_THREADS=1" in capsys.readouterr().err


def test_the_linear_step_is_smollm2s_decode_step() -> None:
    from bench.linear_step import step_shapes

    shapes = step_shapes()
    assert len(shapes) == 121
    assert sum(n * k * 2 for n, k in shapes) == 268_959_744  # bytes of bf16 weights


def test_fio_runs_as_long_as_ours() -> None:
    """fio reads a bare ``--runtime=1.5`` as 1 s: the peer ran shorter than our case."""
    from bench.fio import runtime_arg

    assert runtime_arg(1.5) == "1500ms"
    assert runtime_arg(0.5) == "500ms"
    assert runtime_arg(2) == "2000ms"


def test_the_vllm_peer_is_skipped_saying_why_without_its_venv(tmp_path: Path) -> None:
    from bench.vllm_peer import VllmPeer

    started = VllmPeer.start(tmp_path, tmp_path / "no-venv" / "bin" / "python")
    assert started.peer is None and "no vLLM venv" in started.reason


@pytest.mark.parametrize("argv", [["--kernels", "nope"], ["--rows", "0"],
                                  ["--ext", "/nonexistent/_gemv_x.so"]])
def test_linear_step_refuses_bad_arguments(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from bench.linear_step import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("linear_step: ") and err.count("\n") == 1
