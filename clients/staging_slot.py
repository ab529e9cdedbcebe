"""The client's same-host staging segment over its life (DESIGN §7).

One per client: mapped on the first call that wants it, dropped (and mapped afresh on a
later call) when the daemon no longer knows it, and retired when a call naming one of its
ranges went unanswered.

**Invariant: a range of a segment is handed to another call only after the daemon
answered every call that named it.** A call the daemon did not answer (an attempt timed
out, the channel broke, the caller was cancelled) may still be running at the daemon,
writing a ``GetStaged`` hit into its range or reading a ``CommitStaged`` payload out of
it. The daemon's checks cannot tell: a late ``GetStaged`` write lands in whatever the
range holds by then — another get's rows (which then fail their checksums: a lost read),
or a zero-copy buffer whose commit makes its headers from those bytes (another request's
rows stored under its keys, checksums and all). So such a call retires its segment: its
range is never freed, nothing is allocated from the segment again, the next call maps a
fresh one, and the retired one is handed back to the daemon then (``CloseStaging``; a call
still running there finishes into memory this client no longer uses). A daemon answer of
any kind (a response or an error it named) ends the daemon's use of the range.

A caller's own buffer in the segment (``GrpcStore.staging_buffer``) that such a call named
may still be written by the daemon: release it and take another.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from clients.errors import StagingLost
from clients.plan import Call, Plan
from clients.shm import Staging, map_segment
from kvstore.errors import KVStoreError, StoreUnavailable
from kvstore.wire.proto import kvstore_pb2 as pb

_CLOSE_SEGMENT_S = 2.0


class StagingSlot:
    """Thread-safe; its plans never hold its lock across a ``yield``."""

    def __init__(self, size_bytes: int, enabled: bool) -> None:
        self.size_bytes = size_bytes
        self._lock = threading.Lock()
        self._staging: Staging | None = None
        self._retired: list[int] = []  # ids of retired segments not handed back yet
        self._closed = False
        self.retired_total = 0  # segments retired so far
        # "untried" -> "opening" -> "done"; back to "untried" when the segment is lost,
        # retired or the daemon could not be asked. Calls racing the first open use gRPC.
        self._state = "untried" if enabled else "done"

    @property
    def current(self) -> Staging | None:
        """The mapped segment, if any (without trying to map one)."""
        return self._staging

    def area(self, deadline_s: float) -> Plan[Staging | None]:
        """The mapped segment, mapping one first if none was tried yet."""
        with self._lock:
            if self._state != "untried":
                return self._staging
            self._state = "opening"
        st: Staging | None = None
        state = "done"
        try:
            yield from self._close_retired()  # first: they count against the daemon's bound
            req = pb.OpenStagingRequest(size_bytes=self.size_bytes)
            resp = yield Call("OpenStaging", deadline_s, req)
            st = map_segment(resp)
            if st is None:  # another host: hand the segment back
                yield from self._close_segment(resp.staging_id)
        except StoreUnavailable:
            state = "untried"  # the daemon did not answer: ask again on a later call
        except KVStoreError:
            pass  # the daemon offers no staging: the gRPC path from now on
        finally:
            with self._lock:
                if self._closed and st is not None:
                    st.close()
                    st = None
                self._staging, self._state = st, state
        return st

    def call(self, st: Staging, method: str, deadline_s: float, req: Any) -> Plan[Any]:
        """One same-host call naming a range of ``st``: its response, or None when the
        daemon no longer knows ``st`` (the caller takes the gRPC path). A caller frees its
        range afterwards only ``if not st.retired`` (see the module's invariant)."""
        unanswered = threading.Event()
        try:
            return (yield Call(method, deadline_s, req, on_no_answer=unanswered.set))
        except StagingLost:
            self._drop(st)
            return None
        except BaseException as e:
            if not isinstance(e, KVStoreError):  # interrupted mid-call: maybe sent
                unanswered.set()
            raise
        finally:
            if unanswered.is_set():
                self._retire(st)

    def _drop(self, st: Staging) -> None:
        """The daemon restarted and forgot ``st``: map a fresh segment on the next call.
        The old mapping is not closed here (other calls may still hold views of it); it
        goes when the last of them does."""
        with self._lock:
            if self._staging is st:
                self._staging = None
                self._state = "untried"

    def _retire(self, st: Staging) -> None:
        self._drop(st)
        with self._lock:
            if not st.retired:
                st.retired = True
                self._retired.append(st.staging_id)
                self.retired_total += 1

    def _close_retired(self) -> Plan[None]:
        with self._lock:
            ids, self._retired = self._retired, []
        for sid in ids:
            yield from self._close_segment(sid)

    def _close_segment(self, staging_id: int) -> Plan[None]:
        with contextlib.suppress(KVStoreError):  # the daemon reaps idle segments itself
            yield Call(
                "CloseStaging",
                time.monotonic() + _CLOSE_SEGMENT_S,
                pb.CloseStagingRequest(staging_id=staging_id),
                retry=False,
            )

    def close(self) -> Plan[None]:
        """Hand every segment back (best effort); nothing is mapped afterwards."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            st, self._staging, self._state = self._staging, None, "done"
        yield from self._close_retired()
        if st is not None:
            yield from self._close_segment(st.staging_id)
            st.close()
