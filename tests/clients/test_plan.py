"""The plan drivers: both run a plan identically, errors go into the plan, cleanup runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from clients.plan import Call, Plan, run_plan, run_plan_async
from kvstore.errors import InvalidArgument, StoreUnavailable


def recovering(log: list[str]) -> Plan[str]:
    try:
        first = yield Call("A", 0.0, request=1)
        log.append(f"A->{first}")
        yield Call("B", 0.0, request=2)
    except StoreUnavailable:
        log.append("B failed, fallback")
        second = yield Call("C", 0.0, request=3)
        return f"fallback {second}"
    finally:
        log.append("cleanup")
    return "unreachable in this test"


def failing(log: list[str]) -> Plan[None]:
    try:
        yield Call("B", 0.0)
    finally:
        log.append("cleanup")


def executor(calls: list[str]) -> Callable[[Call], Any]:
    def run(call: Call) -> Any:
        calls.append(call.method)
        if call.method == "B":
            raise StoreUnavailable("down")
        return call.method.lower()

    return run


def drive(kind: str, plan: Plan[Any], calls: list[str]) -> Any:
    run = executor(calls)
    if kind == "sync":
        return run_plan(plan, run)

    async def run_async(call: Call) -> Any:
        await asyncio.sleep(0)
        return run(call)

    return asyncio.run(run_plan_async(plan, run_async))


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_error_thrown_into_the_plan_can_be_recovered(kind: str) -> None:
    log: list[str] = []
    calls: list[str] = []
    assert drive(kind, recovering(log), calls) == "fallback c"
    assert calls == ["A", "B", "C"]
    assert log == ["A->a", "B failed, fallback", "cleanup"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_unhandled_error_leaves_the_plan_after_its_cleanup(kind: str) -> None:
    log: list[str] = []
    with pytest.raises(StoreUnavailable):
        drive(kind, failing(log), [])
    assert log == ["cleanup"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_misuse_raised_before_the_first_call_makes_no_call(kind: str) -> None:
    def bad() -> Plan[None]:
        raise InvalidArgument("bad input")
        yield Call("never", 0.0)  # makes this a generator

    calls: list[str] = []
    with pytest.raises(InvalidArgument):
        drive(kind, bad(), calls)
    assert calls == []
