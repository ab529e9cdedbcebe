"""Dispatch order, per-namespace ordering, pacing and failure propagation."""

from __future__ import annotations

import threading
import time

import pytest

from kvstore.hitrate.request import Request
from kvstore.loadgen import streams
from kvstore.loadgen.errors import LoadgenError
from kvstore.loadgen.keymap import namespace_for
from kvstore.loadgen.replay import TraceRequest
from kvstore.loadgen.streams import Paced, Unpaced, make_dispatcher, make_pacer

NS = [namespace_for(f"s{i}", 64, 1) for i in range(5)]


def items(n: int, namespaces: int = 1, dt: float = 0.0) -> list[TraceRequest]:
    return [TraceRequest(i, Request(i * dt, 64, [i], 64), NS[i % namespaces], []) for i in range(n)]


@pytest.mark.parametrize("mode", ["pool", "namespace"])
def test_one_stream_handles_requests_in_replay_order(mode: str) -> None:
    seen: list[int] = []
    make_dispatcher(mode, 1, float("inf")).run(items(200, 3), lambda tr: seen.append(tr.seq))
    assert seen == list(range(200))


def test_pool_runs_all_requests_concurrently() -> None:
    seen: list[int] = []
    active, peak = [0], [0]
    lock = threading.Lock()

    def handle(tr: TraceRequest) -> None:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.002)
        with lock:
            active[0] -= 1
            seen.append(tr.seq)

    make_dispatcher("pool", 4, float("inf")).run(items(100), handle)
    assert sorted(seen) == list(range(100))
    assert peak[0] > 1


def test_namespace_streams_keep_each_session_in_order() -> None:
    per_ns: dict[str, list[int]] = {}
    threads: dict[str, set[str]] = {}
    lock = threading.Lock()

    def handle(tr: TraceRequest) -> None:
        with lock:
            per_ns.setdefault(tr.ns.model_id, []).append(tr.seq)
            threads.setdefault(tr.ns.model_id, set()).add(threading.current_thread().name)

    make_dispatcher("namespace", 3, float("inf")).run(items(300, 5), handle)
    for ns_id, seqs in per_ns.items():
        assert seqs == sorted(seqs)
        assert len(threads[ns_id]) == 1  # a session is bound to one stream
    assert sum(len(s) for s in per_ns.values()) == 300


@pytest.mark.parametrize("mode", ["pool", "namespace"])
def test_an_escaping_exception_stops_the_run_and_is_raised(mode: str) -> None:
    def handle(tr: TraceRequest) -> None:
        if tr.seq == 10:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make_dispatcher(mode, 2, float("inf")).run(items(10_000), handle)


def test_paced_dispatch_follows_trace_time(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    slept: list[float] = []
    monkeypatch.setattr(streams.time, "sleep", slept.append)
    pacer = Paced(2.0, clock=lambda: now[0])
    pacer.wait_for(50.0)  # the first request sets the origin
    pacer.wait_for(54.0)  # 4 s of trace at speed 2 is due 2 s after the origin
    now[0] = 103.0
    pacer.wait_for(55.0)  # due at 102.5: already late, no sleep
    assert slept == [pytest.approx(2.0)]
    assert isinstance(make_pacer(float("inf")), Unpaced)


def test_bad_dispatch_settings() -> None:
    with pytest.raises(LoadgenError):
        make_dispatcher("random", 2, float("inf"))
    with pytest.raises(LoadgenError):
        make_dispatcher("pool", 0, float("inf"))
    with pytest.raises(LoadgenError):
        Paced(0.0)
