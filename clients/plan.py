"""Client operations as transport-free plans (the "sans-I/O" core of both clients).

A plan is a generator that yields ``Call`` descriptions of RPCs and receives each one's
response (or has its error thrown in at the ``yield``). Everything a client decides —
which path to take, what to retry, when to re-register a namespace or drop a lost
staging segment — is written once, in ``clients.core``, as plans; the sync and asyncio
clients only execute calls (``run_plan`` / ``run_plan_async``), so they cannot drift.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class StreamReader(Protocol):
    def feed(self, msg: Any) -> bool:
        """Take one message of a server stream; False once the rest is not wanted."""


@dataclass(frozen=True, slots=True)
class Call:
    """One RPC of the ``KVStore`` service, attempted until ``deadline_s`` (monotonic).

    Unary calls send ``request`` and resume the plan with the response. A client stream
    (``stream`` set) sends a fresh iterator per attempt. A server stream (``reader`` set)
    feeds its messages to a fresh reader per attempt and resumes the plan with that reader.
    ``retry=False`` makes one attempt only (best-effort housekeeping calls).
    ``on_no_answer`` runs after each attempt the daemon did not answer (UNAVAILABLE,
    DEADLINE_EXCEEDED, CANCELLED): the daemon may have received it and still be running
    it, so a same-host call must not hand its staging range to another call."""

    method: str
    deadline_s: float
    request: Any = None
    stream: Callable[[], Iterator[Any]] | None = None
    reader: Callable[[], StreamReader] | None = None
    retry: bool = True
    on_no_answer: Callable[[], None] | None = None


Plan = Generator[Call, Any, T]


def run_plan(plan: Plan[T], execute: Callable[[Call], Any]) -> T:
    """Drive ``plan`` to its result, executing each call with ``execute``. An exception
    from a call is thrown into the plan, which may recover; its cleanup always runs."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            call = plan.send(value) if error is None else plan.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            error = None
        try:
            value = execute(call)
        except BaseException as e:  # handed to the plan, which re-raises it
            value, error = None, e


async def run_plan_async(plan: Plan[T], execute: Callable[[Call], Awaitable[Any]]) -> T:
    """``run_plan`` for coroutine executors (cancellation is thrown into the plan too)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            call = plan.send(value) if error is None else plan.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            error = None
        try:
            value = await execute(call)
        except BaseException as e:  # handed to the plan, which re-raises it
            value, error = None, e
