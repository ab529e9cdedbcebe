"""The circuit breaker's state machine, on an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import example, given
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


class Model:
    """What the module docstring promises, step by step: the oracle for the property test."""

    def __init__(self, threshold: int, cooldown_s: float) -> None:
        self.threshold, self.cooldown_s = threshold, cooldown_s
        self.state, self.failures, self.opened_at, self.trial_out = "closed", 0, 0.0, False
        self.opened = self.rejected = 0

    def at(self, now: float) -> str:
        if self.state == "open" and now - self.opened_at >= self.cooldown_s:
            self.state, self.trial_out = "half_open", False
        return self.state

    def call(self, now: float) -> bool:
        """Whether the call may go through."""
        state = self.at(now)
        if state == "open" or (state == "half_open" and self.trial_out):
            self.rejected += 1
            return False
        if state == "half_open":
            self.trial_out = True
        return True

    def ok(self) -> None:
        self.state, self.failures, self.trial_out = "closed", 0, False

    def fail(self, now: float) -> None:
        self.failures += 1
        if self.state == "half_open" or self.failures >= self.threshold:
            self.opened += self.state != "open"
            self.state, self.opened_at, self.trial_out = "open", now, False


# Fifty random sequences rarely reach a half-open breaker twice: these always do.
_OPEN = ["fail", "fail", "tick", "tick"]


@given(st.lists(st.sampled_from(["call", "ok", "fail", "tick"]), max_size=60))
@example([*_OPEN, "call", "call", "fail", "call", "tick", "tick", "call", "ok", "call"])
@example([*_OPEN, "call", "ok", "call", "fail", "fail", "call", "tick", "call", "fail", "call"])
def test_any_sequence_follows_the_state_machine(ops: list[str]) -> None:
    clock = Clock()
    b = CircuitBreaker(BreakerConfig(failure_threshold=2, cooldown_s=1), clock)
    model = Model(2, 1.0)
    for op in ops:
        if op == "call":
            if model.call(clock.t):
                b.before_call()
            else:
                with pytest.raises(CircuitOpen):
                    b.before_call()
        elif op == "ok":
            b.on_success()
            model.ok()
        elif op == "fail":
            b.on_failure()
            model.fail(clock.t)
        else:
            clock.t += 0.6
        assert b.state == model.at(clock.t)
        assert (b.opened_total, b.rejected_total) == (model.opened, model.rejected)
        b.check_integrity()


def test_bad_config() -> None:
    with pytest.raises(ValueError):
        BreakerConfig(failure_threshold=0)
