"""Prefill/decode hand-off through the store: the two waits a disaggregated pair needs.

A prefill replica must not answer before the blocks it computed are in the shared store,
although the engine's commit is otherwise best-effort and never waited for (DESIGN §11).
So a request may carry a ``CommitReceipt``: the scheduler seals it when the request
finishes, after handing its commit jobs (zero or more) to the committer, and the committer
reports each job to it as it ends, so ``wait`` returns once everything the request sent is
over (accepted, refused or failed: a receipt says *when*, the store says *what*).
Then ``visible_blocks`` asks the store how many of the prompt's blocks it serves, which is
the truth a decode replica can rely on whatever happened to the commit.

A decode replica calls ``wait_visible`` before it admits the request: it polls the store's
lookup until the prompt's chain shows the blocks the prefill reported, or the deadline
passes (a dead prefill, a store that lost the blocks). Either way the request then runs
normally: admission loads what the store holds and computes the rest, so a hand-off that
failed costs compute, never an error.

Everything here is thread-safe and runs off the engine thread (the server's executor); a
lookup is a read without side effects on recency (DESIGN §6).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.connector.store_link import StoreLink
from engine.errors import EngineIntegrityError
from kvstore.keys import Key, Namespace

POLL_S = 0.02  # how often a decode replica asks the store again while it waits


@dataclass(eq=False)
class PrefillCommit:
    """A request's commit of its prompt, sent the step its prefill completed (not when it
    finishes), so that the next turn of a session, on whichever replica it lands, finds the
    prompt in the store once this request answered. ``receipt`` is sealed at once: it is
    done when the jobs sent then are over (a server holds the answer's end on it, bounded).
    ``blocks``: the leading chain blocks those jobs covered; the request's commit at its
    end sends only what lies past them."""

    receipt: CommitReceipt
    blocks: int


class CommitReceipt:
    """Tells a waiter when every commit job of one request is over.

    The engine thread calls ``expect()`` before it submits each job and ``seal()`` once the
    request has submitted all of them; the committer thread calls ``report(ok)`` when a job
    ends. ``wait`` returns True once sealed with nothing pending."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending = 0
        self._sealed = False
        self.jobs = 0  # submitted
        self.failed = 0  # ended with an error, or with blocks the store dropped
        self._callbacks: list[Callable[[], None]] = []

    def expect(self) -> None:
        with self._cond:
            if self._sealed:
                raise EngineIntegrityError("a commit was added to a sealed receipt")
            self._pending += 1
            self.jobs += 1

    def report(self, ok: bool) -> None:
        with self._cond:
            if self._pending == 0:
                raise EngineIntegrityError("a commit receipt got more reports than jobs")
            self._pending -= 1
            self.failed += not ok
            ready = self._take_callbacks()
        for fn in ready:
            fn()

    def seal(self) -> None:
        with self._cond:
            self._sealed = True
            ready = self._take_callbacks()
        for fn in ready:
            fn()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the receipt is done: now if it is, else on the thread that
        completes it (the engine's or the committer's: ``fn`` must be quick and never
        raise; an event loop's ``call_soon_threadsafe`` is)."""
        with self._cond:
            if not (self._sealed and self._pending == 0):
                self._callbacks.append(fn)
                return
        fn()

    def _take_callbacks(self) -> list[Callable[[], None]]:
        """Under the lock: wake the waiters; the callbacks to run if the receipt is done."""
        self._cond.notify_all()
        if not (self._sealed and self._pending == 0):
            return []
        ready, self._callbacks = self._callbacks, []
        return ready

    @property
    def done(self) -> bool:
        with self._cond:
            return self._sealed and self._pending == 0

    def wait(self, timeout_s: float) -> bool:
        """True once the request finished and its commits are over; False at the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._sealed and self._pending == 0,
                                       max(0.0, timeout_s))

    def check_integrity(self) -> None:
        with self._cond:
            if self._pending < 0 or self._pending > self.jobs or self.failed > self.jobs:
                raise EngineIntegrityError(
                    f"receipt: {self._pending} pending, {self.jobs} jobs, {self.failed} failed")


def visible_blocks(link: StoreLink, ns: Namespace, keys: Sequence[Key],
                   timeout_s: float) -> int:
    """Leading blocks of the chain ``keys`` (of ``ns``) the store serves now; 0 when it
    cannot say."""
    if not keys or not link.enabled:
        return 0
    return link.lookup(keys, timeout_s, ns=ns).hit_blocks


def wait_visible(link: StoreLink, ns: Namespace, keys: Sequence[Key], want: int,
                 timeout_s: float, call_timeout_s: float) -> int:
    """Poll the store until ``want`` leading blocks of ``keys`` are visible or
    ``timeout_s`` passes; returns the blocks visible at the end (maybe fewer)."""
    if not link.enabled:
        return 0  # no store (``--kv-store none``): nothing will ever show up
    want = min(want, len(keys))
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        seen = visible_blocks(link, ns, keys, max(0.001, min(call_timeout_s, left)))
        if seen >= want or left <= 0:
            return seen
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
