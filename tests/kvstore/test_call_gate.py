"""CallGate: calls are admitted only while open, and shut waits for admitted calls."""

from __future__ import annotations

import threading

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
