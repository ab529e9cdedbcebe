"""``ClientCore``: everything both daemon clients decide, written once as plans.

State shared by a client's calls lives here: the circuit breaker, the namespaces this
client registered (so a daemon that restarted and forgot one gets it again instead of
the engine seeing misuse), and the same-host staging segment (``clients.staging_slot``:
remapped when the daemon no longer knows it, retired when a call on it went unanswered,
so the daemon never writes a range another call has been given). Each public method
returns a ``Plan`` (see ``clients.plan``); ``GrpcStore`` runs it with blocking stubs,
``AsyncGrpcStore`` with ``grpc.aio`` ones. Every operation has one deadline, shared by all
the calls it makes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clients import messages as rq
from clients.attempts import Attempts
from clients.breaker import CircuitBreaker
from clients.config import ClientConfig
from clients.identity import Identity, TenantDeleted
from clients.plan import Call, Plan, T
from clients.shm import Staging
from clients.staging_slot import StagingSlot
from kvstore.block import verify_rows
from kvstore.errors import InvalidArgument, StoreUnavailable, UnknownNamespace
from kvstore.keys import Key, Namespace
from kvstore.tier import CommitResult, LookupResult, StoreStats
from kvstore.wire import codec
from kvstore.wire.contact import FirstContact
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.stats import stats_from_proto


class ClientCore:
    """Thread-safe; a plan never holds a lock across a ``yield``, so coroutines of one
    event loop can interleave plans freely."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.breaker = CircuitBreaker(config.breaker)
        self.contact = FirstContact(config.target)  # the first calls wait for the daemon
        self.corrupt_blocks = 0
        self.closed = False
        self.identity: Identity | None = None  # the last WhoAmI answer
        self._registered: dict[bytes, Namespace] = {}
        self._lock = threading.Lock()
        self.slot = StagingSlot(config.shm_bytes, enabled=config.shm != "off")

    # -- plumbing -------------------------------------------------------------------
    def deadline(self, timeout_s: float | None) -> float:
        t = self.config.default_timeout_s if timeout_s is None else timeout_s
        return time.monotonic() + t

    def attempts(self, call: Call) -> Attempts:
        """The retry bookkeeping of one call (raises at once when the client is closed)."""
        if self.closed:
            raise StoreUnavailable("client is closed")
        return Attempts(self.breaker, self.config, call.deadline_s, retry=call.retry,
                        contact=self.contact, on_no_answer=call.on_no_answer)

    def _reregistering(
        self, ns: Namespace, deadline: float, make: Callable[[], Plan[T]]
    ) -> Plan[T]:
        """Run ``make()``; if the daemon no longer knows a namespace this client registered
        (it restarted), register it again and run it once more instead of calling it misuse."""
        try:
            return (yield from make())
        except UnknownNamespace:
            if self._registered.get(ns.fingerprint) != ns:
                raise
            yield from self._register(ns, deadline)
        return (yield from make())

    # -- staging --------------------------------------------------------------------
    @property
    def staging(self) -> Staging | None:
        """The mapped segment, if any (without trying to map one)."""
        return self.slot.current

    def staging_area(self) -> Plan[Staging | None]:
        """The mapped segment, mapping one first if none was tried yet."""
        return self.slot.area(self.deadline(None))

    def close(self) -> Plan[None]:
        """Hand the staging segments back; later calls raise ``StoreUnavailable``."""
        if self.closed:
            return
        try:
            yield from self.slot.close()
        finally:
            self.closed = True

    # -- KVStore --------------------------------------------------------------------
    def register(self, ns: Namespace, timeout_s: float | None) -> Plan[None]:
        return self._register(rq.check_ns(ns), self.deadline(timeout_s))

    def _register(self, ns: Namespace, deadline: float) -> Plan[None]:
        req = pb.RegisterNamespaceRequest(ns=codec.ns_to_proto(ns))
        yield Call("RegisterNamespace", deadline, req)
        self._registered[ns.fingerprint] = ns

    def lookup(
        self, ns: Namespace, keys: Sequence[Key], timeout_s: float | None, prompt_tokens: int
    ) -> Plan[LookupResult]:
        req = pb.LookupRequest(
            ns=codec.ns_to_proto(rq.check_ns(ns)),
            keys=codec.check_keys(keys),
            prompt_tokens=rq.check_prompt_tokens(prompt_tokens),
        )
        deadline = self.deadline(timeout_s)

        def once() -> Plan[LookupResult]:
            resp = yield Call("Lookup", deadline, req)
            return LookupResult(hit_blocks=resp.hit_blocks, tiers=tuple(resp.tiers))

        return self._reregistering(ns, deadline, once)

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        timeout_s: float | None,
        checksums: list[int] | None = None,
    ) -> Plan[int]:
        """Every returned row was checked, in ``dst``, against the checksum stored with
        its block since its commit (DESIGN §4); the first that fails ends the prefix and
        is counted (``corrupt_blocks``). ``checksums`` receives the stored checksums."""
        rq.check_ns(ns)
        keys = codec.check_keys(keys)
        rows = rq.dst_rows(ns, keys, dst)
        deadline = self.deadline(timeout_s)
        if not keys:
            return _const(0)
        out = [] if checksums is None else checksums
        return self._reregistering(
            ns, deadline, lambda: self._get_once(ns, keys, rows, deadline, out)
        )

    def _count_corrupt(self, n: int) -> None:
        if n:
            with self._lock:
                self.corrupt_blocks += n

    def _get_once(
        self,
        ns: Namespace,
        keys: list[Key],
        rows: memoryview,
        deadline: float,
        checksums: list[int],
    ) -> Plan[int]:
        st = yield from self.staging_area()
        if st is not None:
            got = yield from self._get_staged(st, ns, keys, rows, deadline, checksums)
            if got is not None:
                return got
        req = pb.GetRequest(ns=codec.ns_to_proto(ns), keys=keys)
        reader = yield Call("Get", deadline, req, reader=lambda: rq.GetReader(ns, keys, rows))
        self._count_corrupt(reader.corrupt_blocks)
        hit = int(reader.hit)
        checksums.extend(reader.checksums[:hit])
        return hit

    def _get_staged(
        self,
        st: Staging,
        ns: Namespace,
        keys: list[Key],
        rows: memoryview,
        deadline: float,
        checksums: list[int],
    ) -> Plan[int | None]:
        """None: this call cannot use the segment (full, or lost): take the gRPC path.

        The rows are checked after they reach the caller's buffer (copied out of the
        segment, or in place when the buffer is in the segment) against the checksums
        the daemon stored at commit; a row it sent no checksum for is not data."""
        off = st.offset_of(rows)
        owned = off is None
        if off is None:
            off = st.allocator.alloc(len(rows))
            if off is None:
                return None
        try:
            req = pb.GetStagedRequest(
                ns=codec.ns_to_proto(ns),
                keys=keys,
                staging=pb.StagingRef(staging_id=st.staging_id, offset=off),
            )
            done = yield from self.slot.call(st, "GetStaged", deadline, req)
            if done is None:
                return None
            hit = int(done.hit_blocks)
            bb = ns.block_bytes
            if owned and hit:
                rows[: hit * bb] = st.rows(off, hit * bb)
            sums = list(done.checksums[:hit])
            good = verify_rows(rows[: hit * bb], bb, sums)
            self._count_corrupt(int(good < hit))
            checksums.extend(sums[:good])
            return good
        finally:
            if owned and not st.retired:
                st.allocator.free(off)

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        durability: str,
        timeout_s: float | None,
    ) -> Plan[CommitResult]:
        rq.check_ns(ns)
        keys = codec.check_keys(keys)
        views = rq.payload_views(ns, keys, payloads)
        codec.durability_to_proto(durability)
        deadline = self.deadline(timeout_s)
        return self._reregistering(
            ns, deadline, lambda: self._commit_once(ns, keys, views, durability, deadline)
        )

    def _commit_once(
        self,
        ns: Namespace,
        keys: list[Key],
        views: dict[int, memoryview],
        durability: str,
        deadline: float,
    ) -> Plan[CommitResult]:
        st = (yield from self.staging_area()) if views else None
        if st is not None:
            res = yield from self._commit_staged(st, ns, keys, views, durability, deadline)
            if res is not None:
                return res
        resp = yield Call(
            "Commit", deadline, stream=lambda: rq.commit_chunks(ns, keys, views, durability)
        )
        return rq.commit_result(resp)

    def _commit_staged(
        self,
        st: Staging,
        ns: Namespace,
        keys: list[Key],
        views: dict[int, memoryview],
        durability: str,
        deadline: float,
    ) -> Plan[CommitResult | None]:
        """None: this call cannot use the segment (full, or lost): take the gRPC path."""
        bb = ns.block_bytes
        nbytes = len(views) * bb
        off = st.offset_of(next(iter(views.values())))
        contiguous = off is not None and all(
            st.offset_of(v) == off + j * bb for j, v in enumerate(views.values())
        )
        owned = not contiguous
        if owned:
            off = st.allocator.alloc(nbytes)
            if off is None:
                return None
        assert off is not None
        try:
            if owned:
                area = st.rows(off, nbytes)
                for j, v in enumerate(views.values()):
                    area[j * bb : (j + 1) * bb] = v
            ref = pb.StagingRef(staging_id=st.staging_id, offset=off)
            req = rq.staged_commit(ns, keys, views, durability, ref)
            resp = yield from self.slot.call(st, "CommitStaged", deadline, req)
            return None if resp is None else rq.commit_result(resp)
        finally:
            if owned and not st.retired:
                st.allocator.free(off)

    def prefetch(self, ns: Namespace, keys: Sequence[Key], timeout_s: float | None) -> Plan[int]:
        req = pb.PrefetchRequest(ns=codec.ns_to_proto(rq.check_ns(ns)), keys=codec.check_keys(keys))
        deadline = self.deadline(timeout_s)

        def once() -> Plan[int]:
            resp = yield Call("Prefetch", deadline, req)
            return int(resp.top_tier_blocks)

        return self._reregistering(ns, deadline, once)

    def flush(self, timeout_s: float | None) -> Plan[None]:
        yield Call("Flush", self.deadline(timeout_s), pb.FlushRequest())

    def delete_namespace(self, ns: Namespace, timeout_s: float | None) -> Plan[int]:
        req = pb.DeleteNamespaceRequest(ns=codec.ns_to_proto(rq.check_ns(ns)))
        deadline = self.deadline(timeout_s)

        def once() -> Plan[int]:
            resp = yield Call("DeleteNamespace", deadline, req)
            return int(resp.deleted_blocks)

        return self._reregistering(ns, deadline, once)

    def stats(self, timeout_s: float | None) -> Plan[StoreStats]:
        resp = yield Call("Stats", self.deadline(timeout_s), pb.StatsRequest())
        st = stats_from_proto(resp)
        # Blocks this client caught after the daemon's checks (damaged on the wire, in
        # the segment or in the daemon's memory) count as corrupt too.
        counters = dict(st.counters)
        counters["client_corrupt_blocks_total"] = self.corrupt_blocks
        # Staging segments given up after an unanswered same-host call (a slow daemon).
        counters["client_staging_retired_total"] = self.slot.retired_total
        counters["corrupt_blocks_total"] = counters.get("corrupt_blocks_total", 0) + (
            self.corrupt_blocks
        )
        return StoreStats(st.tiers, counters)

    def whoami(self, timeout_s: float | None) -> Plan[Identity]:
        resp = yield Call("WhoAmI", self.deadline(timeout_s), pb.WhoAmIRequest())
        self.identity = Identity(resp.tenant, resp.admin, resp.authenticated)
        return self.identity

    def delete_tenant(self, tenant: str, timeout_s: float | None) -> Plan[TenantDeleted]:
        if not isinstance(tenant, str):
            raise InvalidArgument(f"tenant must be a str, got {type(tenant).__name__}")
        req = pb.DeleteTenantRequest(tenant=tenant)
        resp = yield Call("DeleteTenant", self.deadline(timeout_s), req)
        return TenantDeleted(int(resp.deleted_blocks), int(resp.namespaces))


def _const(value: T) -> Plan[T]:
    """A plan that makes no call."""
    if False:
        yield  # makes this a generator
    return value
