"""Client and daemon limits agree (issue 14, item 12): a request within the key limit
always fits a gRPC message, a request past it is misuse refused before sending, and
misuse never counts against the circuit breaker."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from clients.attempts import Attempts
from clients.breaker import BreakerConfig, CircuitBreaker
from clients.config import ClientConfig
from clients.errors import Overloaded
from clients.sync_client import GrpcStore
from kvstore.errors import InvalidArgument
from kvstore.keys import KEY_BYTES
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from tests.conftest import small_ns

NS = small_ns(model_id="m" * 200, tenant="t" * 200)
SPEC = codec.ns_to_proto(NS)


@given(st.integers(0, codec.MAX_KEYS_PER_REQUEST))
def test_every_request_within_the_key_limit_fits_a_message(n: int) -> None:
    keys = [bytes([i % 256]) * KEY_BYTES for i in range(n)]
    idx = list(range(n))
    largest = [
        pb.LookupRequest(ns=SPEC, keys=keys, prompt_tokens=(1 << 63) - 1),
        pb.CommitStagedRequest(
            ns=SPEC,
            keys=keys,
            indices=[i + (1 << 20) for i in idx],  # bigger varints than any real index
            durability=pb.DURABILITY_SSD,
            staging=pb.StagingRef(staging_id=(1 << 64) - 1, offset=(1 << 64) - 1),
            headers=[b"h" * 64] * n,
        ),
        pb.CommitRequest(open=pb.CommitOpen(ns=SPEC, keys=keys, indices=idx)),
        pb.NodePutRequest(open=pb.NodePutOpen(ns=SPEC, keys=keys, present_ok=True)),
    ]
    for msg in largest:
        assert msg.ByteSize() <= codec.MAX_MESSAGE_BYTES, type(msg).__name__


def test_the_largest_chunk_fits_a_message() -> None:
    c = pb.CommitRequest(
        chunk=pb.BlockChunk(
            block_index=(1 << 32) - 1,
            offset=(1 << 64) - 1,
            data=b"x" * codec.CHUNK_BYTES,
            last=True,
        )
    )
    assert c.ByteSize() <= codec.MAX_MESSAGE_BYTES


def test_a_huge_lookup_is_misuse_and_spares_the_breaker(shared_daemon: DaemonProcess) -> None:
    cfg = ClientConfig(target=shared_daemon.target, breaker=BreakerConfig(failure_threshold=1))
    ns = small_ns(model_id="limits")
    with GrpcStore(cfg) as s:
        s.register(ns)
        for n in (65_000, codec.MAX_KEYS_PER_REQUEST + 1):
            keys = [i.to_bytes(KEY_BYTES, "big") for i in range(n)]
            with pytest.raises(InvalidArgument):
                s.lookup(ns, keys)
        assert s.breaker.state == "closed"
        at_limit = [i.to_bytes(KEY_BYTES, "big") for i in range(codec.MAX_KEYS_PER_REQUEST)]
        assert s.lookup(ns, at_limit).hit_blocks == 0  # the daemon takes the whole limit
        assert s.lookup(ns, at_limit[:1]).hit_blocks == 0
        assert s.breaker.state == "closed"


def test_a_message_refused_for_its_size_is_misuse_without_a_verdict() -> None:
    cfg = ClientConfig(target="127.0.0.1:1")
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=1, cooldown_s=0))
    breaker.on_failure()  # open; with no cool-down the next call is the half-open trial
    a = Attempts(breaker, cfg, deadline_s=float("inf"))
    a.start()
    with pytest.raises(InvalidArgument):
        a.failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "Sent message larger than max (5 vs. 4)")
    assert breaker.state == "half_open"
    breaker.before_call()  # the trial was handed back, not left out forever


def test_an_overloaded_daemon_is_retried_and_counted() -> None:
    cfg = ClientConfig(target="127.0.0.1:1", retry_initial_backoff_s=0.001)
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=3))
    a = Attempts(breaker, cfg, deadline_s=float("inf"))
    for _ in range(3):  # retried while the deadline allows, each refusal counted
        a.start()
        assert a.failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "Overloaded: budget") > 0
    assert breaker.state == "open"
    with pytest.raises(Overloaded):  # the breaker is open now: the real cause is reported
        a.start()
