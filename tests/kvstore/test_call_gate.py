"""CallGate: calls are admitted only while open, and shut waits for admitted calls."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from kvstore.call_gate import CallGate
from kvstore.errors import StoreUnavailable


def test_shut_waits_for_a_call_in_flight_then_refuses_new_ones() -> None:
    gate = CallGate("thing is closed")
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def call() -> None:
        with gate.call():
            inside.set()
            release.wait(5)
            order.append("call left")

    worker = threading.Thread(target=call)
    worker.start()
    assert inside.wait(5)
    shutter = threading.Thread(target=lambda: order.append(f"shut {gate.shut()}"))
    shutter.start()
    shutter.join(0.2)
    assert shutter.is_alive()  # still waiting for the admitted call
    release.set()
    worker.join(5)
    shutter.join(5)
    assert order == ["call left", "shut True"]
    with pytest.raises(StoreUnavailable, match="thing is closed"), gate.call():
        pass
    assert gate.shut() is False  # only the first shut closes


def test_a_call_that_raises_still_leaves_the_gate() -> None:
    gate = CallGate("closed")
    with pytest.raises(ValueError), gate.call():
        raise ValueError("boom")
    done = threading.Thread(target=gate.shut)
    done.start()
    done.join(5)
    assert not done.is_alive()


def test_close_sequence_stops_flushes_then_releases_once_even_when_the_flush_raises() -> None:
    gate = CallGate("closed")
    steps: list[str] = []
    entered, leave = threading.Event(), threading.Event()

    def caller() -> None:
        with gate.call():
            entered.set()
            leave.wait(5)
            steps.append("call left")

    t = threading.Thread(target=caller)
    t.start()
    assert entered.wait(5)

    def flush() -> None:
        steps.append("flush")
        raise OSError("disk gone")

    closer = threading.Thread(target=lambda: steps.append(f"closed {_close(gate, steps, flush)}"))
    closer.start()
    leave.set()  # the admitted call finishes first, whenever close started
    t.join(5)
    closer.join(5)
    assert steps == ["call left", "stop", "flush", "release", "closed raised"]
    assert not gate.close_sequence(stop=lambda: steps.append("again"),
                                   release=lambda: steps.append("again"))
    assert steps[-1] == "closed raised"
    crashed = CallGate("closed")  # no flush: stop as a crash would
    seen: list[str] = []
    assert crashed.close_sequence(stop=lambda: seen.append("stop"),
                                  release=lambda: seen.append("release"))
    assert seen == ["stop", "release"]


def _close(gate: CallGate, steps: list[str], flush: Callable[[], None]) -> str:
    try:
        gate.close_sequence(stop=lambda: steps.append("stop"), flush=flush,
                            release=lambda: steps.append("release"))
    except OSError:
        return "raised"
    return "returned"
