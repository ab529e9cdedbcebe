"""The engine's own thread: it owns the ``LLMEngine`` and runs its steps, off the event loop.

The HTTP side never touches the engine. It submits a request (token ids, sampling
parameters, scope) and gets a ``Handle`` whose ``events`` (an ``asyncio.Queue`` on the
server's loop) receive ``TokensEvent``s as the engine produces tokens and one
``DoneEvent`` (or ``ErrorEvent``) at the end. ``abort(handle)`` stops a request wherever it
is (a client that went away): the engine thread frees its sequence before its next step.
So ``/health`` answers and disconnects are noticed even during a minute-long prefill,
because the event loop is never the one computing.

Commands reach the thread through a queue that it drains between steps; a step is never
interrupted. A bug in a step fails the requests in flight (500) and the thread goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from engine.connector.handoff import CommitReceipt
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence, TokenLogprob
from engine.errors import EngineError
from engine.kv.request_scope import RequestScope

log = logging.getLogger("engine.server")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TokensEvent:
    token_ids: list[int]  # new output tokens since the last event
    choice: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, if asked


@dataclass(frozen=True, slots=True)
class DoneEvent:
    seq: Sequence  # finished: finish_reason and stats are final
    choice: int = 0


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    error: BaseException  # EngineInputError: the client's fault (400); else a bug (500)
    choice: int = 0


Event = TokensEvent | DoneEvent | ErrorEvent


@dataclass(eq=False)
class Handle:
    token_ids: list[int]
    params: SamplingParams
    scope: RequestScope
    loop: asyncio.AbstractEventLoop
    arrival_s: float = field(default_factory=time.perf_counter)  # the HTTP request's
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)  # shared by choices
    choice: int = 0  # the index of its choice (``n`` > 1 shares one queue)
    # A sibling choice waits for this one's first token: its prompt's blocks are then in
    # the pool's prefix index, so the sibling hits them instead of computing them again.
    after: Handle | None = None
    # A prefill replica's request (``kv_transfer_params.do_remote_decode``): the handler
    # waits on it for the request's commit before it answers (engine.connector.handoff).
    receipt: CommitReceipt | None = None
    # Engine thread only.
    seq: Sequence | None = None
    delivered: int = 0
    aborted: bool = False
    abort_reason: str = "abort"
    settled: bool = False  # it has a first token, or ended: its siblings may start

    def _emit(self, event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # the server's loop is gone (shutting down)
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


@dataclass(eq=False)
class _Call(Generic[T]):
    """A function the engine thread runs between steps (``EngineLoop.call``)."""

    fn: Callable[[LLMEngine], T]
    future: concurrent.futures.Future[T]

    def run(self, engine: LLMEngine) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            self.future.set_result(self.fn(engine))
        except BaseException as e:  # the caller gets it; the engine thread goes on
            self.future.set_exception(e)


class EngineLoop:
    def __init__(self, engine: LLMEngine,
                 on_finished: Callable[[Handle], None] | None = None) -> None:
        """``on_finished`` runs on the engine thread for every request that ends, aborted
        ones included (metrics)."""
        self.engine = engine
        self._on_finished = on_finished or (lambda handle: None)
        self._commands: queue.SimpleQueue[tuple[str, Handle | _Call[Any] | None]] = (
            queue.SimpleQueue())
        self._wake = threading.Event()
        self._active: dict[int, Handle] = {}  # seq_id -> handle (engine thread only)
        self._deferred: list[Handle] = []  # siblings waiting on their first choice
        self._in_flight = 0  # submitted and not yet finished (any thread reads it)
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    # -- any thread ---------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def try_submit(self, handle: Handle, limit: int) -> bool:
        """Queue ``handle`` unless ``limit`` requests are already in flight."""
        return self.try_submit_all([handle], limit)

    def try_submit_all(self, handles: list[Handle], limit: int) -> bool:
        """Queue all of ``handles`` (one request's choices) or none: none when that would
        put more than ``limit`` sequences in flight (one request alone is always let in)."""
        with self._lock:
            if self._in_flight and self._in_flight + len(handles) > limit:
                return False
            self._in_flight += len(handles)
        for handle in handles:
            self._commands.put(("add", handle))
        self._wake.set()
        return True

    def call(self, fn: Callable[[LLMEngine], T]) -> concurrent.futures.Future[T]:
        """Run ``fn(engine)`` on the engine thread between two steps (the engine is never
        touched from another thread); its result or exception comes back in the future."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._commands.put(("call", _Call(fn, fut)))
        self._wake.set()
        return fut

    def abort(self, handle: Handle, reason: str = "abort") -> None:
        """Stop ``handle``'s request; ``reason`` becomes its finish reason (``"stop"`` when
        the server found a stop string, ``"abort"`` when the client left)."""
        handle.abort_reason = reason
        self._commands.put(("abort", handle))
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (requests in flight are aborted), then close the engine."""
        self._commands.put(("stop", None))
        self._wake.set()
        self._thread.join()
        self.engine.close()

    # -- the engine thread --------------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._drain_commands():
                break
            self._start_deferred()
            if not self.engine.has_unfinished:
                # Idle: still take in finished copy-outs and commits, so their blocks are
                # released and marked stored without waiting for the next request.
                try:
                    self.engine.scheduler.poll()
                except Exception:  # a bug in a transfer thread: keep serving
                    log.exception("taking in finished store transfers failed")
                copying = not self.engine.committer.wait_idle(0)
                self._wake.wait(timeout=0.02 if copying else 0.5)
                self._wake.clear()
                continue
            try:
                self.engine.step()
            except Exception as e:  # a bug: fail what is in flight, keep serving
                log.exception("engine step failed; failing %d requests", len(self._active))
                self._fail_all(e)
                continue
            self._publish()
        for handle in [*self._active.values(), *self._deferred]:
            self._abort(handle)

    def _drain_commands(self) -> bool:
        while True:
            try:
                cmd, handle = self._commands.get_nowait()
            except queue.Empty:
                return True
            if cmd == "stop":
                return False
            if isinstance(handle, _Call):
                handle.run(self.engine)
                continue
            assert handle is not None
            if cmd == "add":
                self._add(handle)
            elif cmd == "abort":
                self._abort(handle)

    def _start_deferred(self) -> None:
        waiting = self._deferred
        self._deferred = []
        for handle in waiting:
            self._add(handle)

    def _add(self, handle: Handle) -> None:
        if handle.aborted:  # the client left before the engine saw the request
            self._finished(handle)
            return
        if handle.after is not None and not handle.after.settled:
            self._deferred.append(handle)
            return
        try:
            handle.seq = self.engine.add_request(handle.token_ids, handle.params, handle.scope,
                                                 commit_receipt=handle.receipt)
        except (EngineError, ValueError) as e:
            self._finished(handle)
            handle._emit(ErrorEvent(e, handle.choice))
            return
        self._active[handle.seq.seq_id] = handle

    def _abort(self, handle: Handle) -> None:
        handle.aborted = True
        seq = handle.seq
        if seq is None or seq.seq_id not in self._active:
            return  # not added yet (``_add`` drops it) or already finished
        self.engine.abort(seq)
        seq.finish_reason = handle.abort_reason
        del self._active[seq.seq_id]
        self._finished(handle)
        self._on_finished(handle)

    def _publish(self) -> None:
        for seq_id, handle in list(self._active.items()):
            seq = handle.seq
            assert seq is not None
            out = seq.output_ids
            if len(out) > handle.delivered:
                handle._emit(TokensEvent(out[handle.delivered :], handle.choice,
                                         seq.logprobs[handle.delivered :]))
                handle.delivered = len(out)
                handle.settled = True
            if seq.is_finished:
                del self._active[seq_id]
                self._finished(handle)
                self._on_finished(handle)
                handle._emit(DoneEvent(seq, handle.choice))

    def _fail_all(self, error: BaseException) -> None:
        for handle in list(self._active.values()):
            if handle.seq is not None and not handle.seq.is_finished:
                try:
                    self.engine.abort(handle.seq)
                except Exception:  # the engine is already broken; the error is reported
                    log.exception("abort after a failed step")
            self._finished(handle)
            handle._emit(ErrorEvent(error, handle.choice))
        self._active.clear()

    def _finished(self, handle: Handle) -> None:
        handle.settled = True
        if handle.receipt is not None:
            # The engine sealed it already if the request ran; one that never ran (or
            # failed) has no commit to wait for.
            handle.receipt.seal()
        with self._lock:
            self._in_flight -= 1
