"""The circuit breaker's state machine, on an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.breaker import BreakerConfig, CircuitBreaker
from clients.errors import CircuitOpen
from kvstore.errors import StoreUnavailable


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_opens_after_threshold_then_half_opens_and_closes() -> None:
    clock = Clock()
    b = CircuitBreaker(BreakerConfig(failure_threshold=3, cooldown_s=5), clock)
    for _ in range(2):
        b.before_call()
        b.on_failure()
    assert b.state == "closed"
    b.before_call()
    b.on_failure()
    assert b.state == "open" and b.opened_total == 1
    with pytest.raises(CircuitOpen):
        b.before_call()
    clock.t = 5
    assert b.state == "half_open"
    b.before_call()  # the one trial call
    with pytest.raises(StoreUnavailable):
        b.before_call()  # others wait for the trial
    b.on_failure()
    assert b.state == "open" and b.opened_total == 2
    clock.t = 10
    b.before_call()
    b.on_success()
    assert b.state == "closed"
    b.before_call()
    b.check_integrity()


def test_success_resets_the_failure_count() -> None:
    b = CircuitBreaker(BreakerConfig(failure_threshold=2, cooldown_s=1), Clock())
    for _ in range(10):
        b.on_failure()
        b.on_success()
    assert b.state == "closed"


@given(st.lists(st.sampled_from(["call", "ok", "fail", "tick"]), max_size=60))
def test_any_sequence_keeps_the_invariants(ops: list[str]) -> None:
    clock = Clock()
    b = CircuitBreaker(BreakerConfig(failure_threshold=3, cooldown_s=1), clock)
    streak = 0
    for op in ops:
        if op == "call":
            try:
                b.before_call()
            except CircuitOpen:
                assert b.state in ("open", "half_open")
        elif op == "ok":
            b.on_success()
            streak = 0
            assert b.state == "closed"
        elif op == "fail":
            b.on_failure()
            streak += 1
            if streak >= 3:
                assert b.state == "open"
        else:
            clock.t += 0.6
        b.check_integrity()


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        BreakerConfig(failure_threshold=0)
