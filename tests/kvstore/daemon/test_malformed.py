"""Malformed and truncated requests on the raw protocol: refused with a status code,
no side effects; a truncated Commit keeps only its complete blocks (DESIGN §7)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.block import HEADER_BYTES, make_header
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from tests.conftest import payload_for, small_ns
from tests.kvstore.daemon.conftest import make_chain, stream_messages

NS = small_ns(model_id="malformed")
SPEC = codec.ns_to_proto(NS)
BB = NS.block_bytes
REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}


@pytest.fixture(scope="module")
def stub(shared_daemon: DaemonProcess) -> Iterator[pb_grpc.KVStoreStub]:
    with grpc.insecure_channel(shared_daemon.target) as ch:
        s = pb_grpc.KVStoreStub(ch)
        s.RegisterNamespace(pb.RegisterNamespaceRequest(ns=SPEC), timeout=10)
        yield s


def used_bytes(stub: pb_grpc.KVStoreStub) -> int:
    return sum(t.used_bytes for t in stub.Stats(pb.StatsRequest(), timeout=10).tiers)


def hits(stub: pb_grpc.KVStoreStub, keys: list[bytes]) -> int:
    return stub.Lookup(pb.LookupRequest(ns=SPEC, keys=keys), timeout=10).hit_blocks


def encoded(keys: list[bytes], i: int, payload: bytes | None = None) -> bytes:
    p = payload_for(NS, keys[i]) if payload is None else payload
    return make_header(NS.fingerprint, keys[i], p).pack() + p


def open_msg(keys: list[bytes], indices: list[int], **kw: object) -> pb.CommitRequest:
    return pb.CommitRequest(open=pb.CommitOpen(ns=SPEC, keys=keys, indices=indices, **kw))  # type: ignore[arg-type]


def chunk(i: int, off: int, data: bytes, last: bool) -> pb.CommitRequest:
    return pb.CommitRequest(chunk=pb.BlockChunk(block_index=i, offset=off, data=data, last=last))


def whole(keys: list[bytes], i: int, data: bytes | None = None) -> pb.CommitRequest:
    return chunk(i, 0, encoded(keys, i) if data is None else data, True)


def refused(stub: pb_grpc.KVStoreStub, msgs: list[pb.CommitRequest]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        stub.Commit(iter(msgs), timeout=10)
    return e.value.code()


def _flip(b: bytes, pos: int) -> bytes:
    return b[:pos] + bytes([b[pos] ^ 1]) + b[pos + 1 :]


def malformed_commits(keys: list[bytes]) -> dict[str, list[pb.CommitRequest]]:
    good0 = whole(keys, 0)
    enc1 = encoded(keys, 1)
    return {
        "no open": [good0],
        "two opens": [open_msg(keys, [0]), open_msg(keys, [0])],
        "unannounced block": [open_msg(keys, [0]), good0, whole(keys, 1)],
        "index outside chain": [open_msg(keys, [0, 9])],
        "duplicate index": [open_msg(keys, [0, 0])],
        "bad checksum in a later block": [
            open_msg(keys, [0, 1]),
            good0,
            whole(keys, 1, _flip(enc1, 100)),
        ],
        "wrong key in header": [open_msg(keys, [0, 1]), good0, whole(keys, 1, encoded(keys, 0))],
        "bad magic": [open_msg(keys, [0]), whole(keys, 0, b"XXXX" + encoded(keys, 0)[4:])],
        "offset gap": [
            open_msg(keys, [0]),
            chunk(0, 0, enc1[:100], False),
            chunk(0, 200, enc1[200:], True),
        ],
        "past the block end": [open_msg(keys, [0]), whole(keys, 0, encoded(keys, 0) + b"x")],
        "last chunk too early": [open_msg(keys, [0]), whole(keys, 0, encoded(keys, 0)[:-1])],
        "chunk after completion": [open_msg(keys, [0]), good0, good0],
        "oversized chunk": [
            open_msg(keys, [0]),
            chunk(0, 0, b"\0" * (codec.CHUNK_BYTES + 1), False),
        ],
        "short key": [open_msg([*keys[:1], b"short"], [0]), good0],
        "fingerprint mismatch": [
            pb.CommitRequest(
                open=pb.CommitOpen(
                    ns=pb.NamespaceSpec(**{**_spec_fields(), "fingerprint": b"\0" * 16}),
                    keys=keys,
                    indices=[0],
                )
            ),
            good0,
        ],
        "unknown durability": [open_msg(keys, [0], durability=7), good0],
    }


def _spec_fields() -> dict[str, object]:
    return {f.name: getattr(SPEC, f.name) for f in pb.NamespaceSpec.DESCRIPTOR.fields}


def test_malformed_commits_are_refused_without_side_effects(stub: pb_grpc.KVStoreStub) -> None:
    keys = make_chain(NS, 3, seed=11)
    before = used_bytes(stub)
    for name, msgs in malformed_commits(keys).items():
        assert refused(stub, msgs) in REFUSED, name
        assert hits(stub, keys) == 0, name
    assert used_bytes(stub) == before
    # The same blocks, well formed, are accepted afterwards: nothing was poisoned.
    resp = stub.Commit(iter([open_msg(keys, [0, 1]), whole(keys, 0), whole(keys, 1)]), timeout=10)
    assert (resp.inserted, resp.incomplete) == (2, 0) and hits(stub, keys) == 2


def test_malformed_reads_are_refused(stub: pb_grpc.KVStoreStub) -> None:
    keys = make_chain(NS, 2, seed=12)
    bad = [
        pb.LookupRequest(ns=SPEC, keys=[b"x" * 15]),
        pb.LookupRequest(ns=pb.NamespaceSpec(model_id="m"), keys=keys),
        pb.LookupRequest(ns=pb.NamespaceSpec(**{**_spec_fields(), "kv_dtype": "int3"}), keys=keys),
        pb.LookupRequest(
            ns=pb.NamespaceSpec(**{**_spec_fields(), "model_id": "never-registered"}), keys=keys
        ),
    ]
    for req in bad:
        with pytest.raises(grpc.RpcError) as e:
            stub.Lookup(req, timeout=10)
        assert e.value.code() in REFUSED
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Get(pb.GetRequest(ns=req.ns, keys=req.keys), timeout=10))
        assert e.value.code() in REFUSED
    with pytest.raises(grpc.RpcError) as e:
        stub.GetStaged(
            pb.GetStagedRequest(ns=SPEC, keys=keys, staging=pb.StagingRef(staging_id=12345)),
            timeout=10,
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_stream_ending_mid_block_commits_only_complete_blocks(stub: pb_grpc.KVStoreStub) -> None:
    keys = make_chain(NS, 3, seed=13)
    enc2 = encoded(keys, 2)
    msgs = [
        open_msg(keys, [0, 1, 2]),
        whole(keys, 0),
        whole(keys, 1),
        chunk(2, 0, enc2[:500], False),
    ]
    resp = stub.Commit(iter(msgs), timeout=10)
    assert (resp.inserted, resp.incomplete) == (2, 1)
    assert hits(stub, keys) == 2


def test_cancelled_stream_commits_only_complete_blocks(
    stub: pb_grpc.KVStoreStub, shared_daemon: DaemonProcess
) -> None:
    keys = make_chain(NS, 3, seed=14)
    read_before = stream_messages(shared_daemon, "Commit")
    enc1 = encoded(keys, 1)
    sent_partial = threading.Event()
    release = threading.Event()

    def gen() -> Iterator[pb.CommitRequest]:
        yield open_msg(keys, [0, 1])
        yield whole(keys, 0)
        yield chunk(1, 0, enc1[:300], False)
        sent_partial.set()
        release.wait(30)  # the client "dies" here, mid-block

    fut = stub.Commit.future(gen(), timeout=30)
    assert sent_partial.wait(10)
    # Cut the stream only once the daemon has read all three messages: cut earlier, it
    # would rightly keep nothing (block 0 not yet in), and the count below would be 0.
    deadline = time.monotonic() + 30
    while stream_messages(shared_daemon, "Commit") < read_before + 3:
        assert time.monotonic() < deadline, "the daemon never read the three messages"
        time.sleep(0.01)
    fut.cancel()
    release.set()
    deadline = time.monotonic() + 10
    while hits(stub, keys) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hits(stub, keys) == 1  # block 0 complete and verified; block 1 never stored


_fields = st.fixed_dictionaries(
    {
        "model_id": st.text(max_size=8),
        "model_revision": st.text(max_size=4),
        "kv_dtype": st.sampled_from(["float16", "bfloat16", "float32", "x", ""]),
        "kv_layout": st.sampled_from(["mha", "mla", "?"]),
        "cached_layers": st.lists(st.integers(0, 2**32 - 1), max_size=4),
        "kv_heads": st.integers(0, 2**32 - 1),
        "head_dim": st.integers(0, 2**32 - 1),
        "block_tokens": st.integers(0, 2**32 - 1),
        "tp_rank": st.integers(0, 3),
        "tp_size": st.integers(0, 3),
        "hash_alg": st.sampled_from(["xxh3_128", "blake2b_128", "md5"]),
        "tenant": st.text(max_size=3),
        "fingerprint": st.binary(max_size=17),
    }
)
_keys = st.lists(st.binary(min_size=0, max_size=20), max_size=6)
_chunks = st.lists(
    st.builds(
        pb.BlockChunk,
        block_index=st.integers(0, 8),
        offset=st.integers(0, 5000),
        data=st.binary(max_size=300),
        last=st.booleans(),
    ),
    max_size=5,
)


@given(
    fields=_fields,
    keys=_keys,
    indices=st.lists(st.integers(0, 8), max_size=4),
    chunks=_chunks,
    durability=st.integers(0, 3),
)
def test_fuzzed_requests_never_break_the_daemon(
    stub: pb_grpc.KVStoreStub,
    fields: dict,
    keys: list[bytes],
    indices: list[int],
    chunks: list[pb.BlockChunk],
    durability: int,
) -> None:
    spec = pb.NamespaceSpec(**fields)
    for rpc, arg in (
        (stub.Lookup, pb.LookupRequest(ns=spec, keys=keys)),
        (stub.RegisterNamespace, pb.RegisterNamespaceRequest(ns=spec)),
        (lambda r, timeout: list(stub.Get(r, timeout=timeout)), pb.GetRequest(ns=spec, keys=keys)),
        (
            stub.Commit,
            iter(
                [
                    pb.CommitRequest(
                        open=pb.CommitOpen(
                            ns=spec, keys=keys, indices=indices, durability=durability
                        )
                    ),
                    *(pb.CommitRequest(chunk=c) for c in chunks),
                ]
            ),
        ),
        (
            stub.Commit,
            iter(
                [
                    open_msg(make_chain(NS, 2, seed=15), indices, durability=durability),
                    *(pb.CommitRequest(chunk=c) for c in chunks),
                ]
            ),
        ),
    ):
        try:
            rpc(arg, timeout=10)
        except grpc.RpcError as e:
            assert e.code() in REFUSED, e.details()
    # Random bytes never verify, so nothing of the fuzz can have been stored (the chunks
    # above are too short to complete a block: the test below completes real ones).
    assert hits(stub, make_chain(NS, 2, seed=15)) == 0


_ENCODED_BYTES = HEADER_BYTES + BB
#: Bytes a commit must verify: every header field but the creation time (the writer's
#: metadata), and the payload.
_CHECKED_BYTES = st.one_of(st.integers(0, 55), st.integers(HEADER_BYTES, _ENCODED_BYTES - 1))


@given(
    # Above every fixed seed of this module (11-16): the daemon is shared, and a chain this
    # test stores (hypothesis draws small seeds often) would be a hit in another test.
    seed=st.integers(1 << 20, 2**63),
    flips=st.lists(st.one_of(st.none(), _CHECKED_BYTES), min_size=2, max_size=2),
    cuts=st.lists(st.lists(st.integers(1, _ENCODED_BYTES - 1), max_size=4), min_size=2, max_size=2),
)
def test_fuzzed_complete_blocks_are_stored_only_when_every_byte_verifies(
    stub: pb_grpc.KVStoreStub, seed: int, flips: list[int | None], cuts: list[list[int]]
) -> None:
    # Issue 14 (item 11): the fuzz above never completes a block, so "nothing stored" held
    # whatever the daemon verified. Here two whole blocks arrive in random chunks, each
    # intact or with one flipped checked bit: all intact is stored, any flip stores nothing.
    keys = make_chain(NS, 2, seed=seed)
    msgs = [open_msg(keys, [0, 1])]
    for i in range(2):
        data = encoded(keys, i)
        if flips[i] is not None:
            data = _flip(data, flips[i])
        edges = [0, *sorted(set(cuts[i])), len(data)]
        msgs += [chunk(i, a, data[a:b], b == len(data)) for a, b in itertools.pairwise(edges)]
    # Hypothesis may draw a seed again: compare with what was stored before this example.
    before = (hits(stub, keys[:1]), hits(stub, keys[1:]))
    if flips == [None, None]:
        resp = stub.Commit(iter(msgs), timeout=10)
        assert (resp.inserted + resp.present, resp.incomplete) == (2, 0)
        assert hits(stub, keys) == 2
    else:
        assert refused(stub, msgs) in REFUSED
        assert (hits(stub, keys[:1]), hits(stub, keys[1:])) == before


def test_staged_commit_verifies_every_row(stub: pb_grpc.KVStoreStub) -> None:
    from clients.shm import map_segment

    keys = make_chain(NS, 2, seed=16)
    seg = map_segment(stub.OpenStaging(pb.OpenStagingRequest(size_bytes=4 * BB), timeout=10))
    assert seg is not None
    try:
        rows = seg.rows(0, 2 * BB)
        rows[:BB] = payload_for(NS, keys[0])
        rows[BB:] = payload_for(NS, keys[1])
        headers = [
            make_header(NS.fingerprint, keys[i], payload_for(NS, keys[i])).pack() for i in range(2)
        ]
        ref = pb.StagingRef(staging_id=seg.staging_id, offset=0)

        def commit(**kw: object) -> pb.CommitResponse:
            args = dict(ns=SPEC, keys=keys, indices=[0, 1], staging=ref, headers=headers)
            return stub.CommitStaged(pb.CommitStagedRequest(**{**args, **kw}), timeout=10)  # type: ignore[arg-type]

        rows[BB + 5] ^= 1  # the second row no longer matches its header
        for kw in (
            {},
            {"headers": headers[:1]},
            {"headers": [headers[1], headers[0]]},
            {"staging": pb.StagingRef(staging_id=seg.staging_id, offset=1 << 40)},
            {"indices": [0, 5]},
            {"headers": [b"short", headers[1]]},
        ):
            with pytest.raises(grpc.RpcError) as e:
                commit(**kw)
            assert e.value.code() in REFUSED, kw
        assert hits(stub, keys) == 0
        rows[BB + 5] ^= 1
        assert commit().inserted == 2 and hits(stub, keys) == 2
        rows[:] = b"\0" * (2 * BB)
        done = stub.GetStaged(pb.GetStagedRequest(ns=SPEC, keys=keys, staging=ref), timeout=10)
        assert done.hit_blocks == 2 and bytes(rows[:BB]) == payload_for(NS, keys[0])
    finally:
        stub.CloseStaging(pb.CloseStagingRequest(staging_id=seg.staging_id), timeout=10)
        seg.close()
