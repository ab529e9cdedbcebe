"""Model-based property test: any sequence of puts, gets, touches, sweeps, clock jumps,
deletes and reopens leaves the tier agreeing with a dictionary model (capacity large
enough that only retention removes blocks), with exact bytes and clean integrity."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from storage_nodes.ssd import SSDTier
from tests.io_backends import backends_here
from tests.storage_nodes.ssd.helpers import FakeClock, chain, make_config, rows, small_ns

NS = small_ns()
CHAINS = [chain(NS, 6, salt=s) for s in range(4)]
RETENTION_S = 600.0

op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 3), st.integers(0, 5), st.integers(1, 6)),
    st.tuples(st.just("get"), st.integers(0, 3), st.integers(0, 5), st.integers(1, 6)),
    st.tuples(st.just("touch"), st.integers(0, 3), st.integers(0, 5), st.integers(1, 6)),
    st.tuples(st.just("advance"), st.sampled_from([30.0, 300.0, 590.0, 700.0])),
    st.tuples(st.just("sweep")),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("delete")),
)


class Model:
    def __init__(self, clock: FakeClock, cfg) -> None:
        self.clock, self.cfg = clock, cfg
        self.bucket: dict[bytes, int] = {}

    def live(self, k: bytes) -> bool:
        b = self.bucket.get(k)
        return b is not None and b >= self.cfg.expiry_bucket(self.clock())

    def prefix(self, keys) -> int:
        n = 0
        while n < len(keys) and self.live(keys[n]):
            n += 1
        return n

    def stamp(self, keys) -> None:
        for k in keys:
            self.bucket[k] = self.cfg.bucket_of(self.clock())


@settings(max_examples=150, deadline=None)
@given(st.lists(op, min_size=1, max_size=25), st.sampled_from(["pread", "uring"]))
def test_tier_matches_model(ops, backend) -> None:
    if backend not in backends_here():
        backend = "pread"  # io_uring refused here (the header says so; CI requires it)
    clock = FakeClock()
    with tempfile.TemporaryDirectory() as d:
        cfg = make_config(Path(d), io_backend=backend, retention_s=RETENTION_S, clock=clock)
        model = Model(clock, cfg)
        t = SSDTier(cfg)
        t.register(NS)
        try:
            for o in ops:
                if o[0] in ("put", "get", "touch"):
                    keys = CHAINS[o[1]][o[2] : o[2] + o[3]]
                    if not keys:
                        continue
                    if o[0] == "put":
                        r = t.put(NS, keys, rows(NS, keys))
                        assert r.present == sum(model.live(k) for k in keys)
                        assert r.inserted == len(keys) - r.present and r.dropped == 0
                        model.stamp(keys)
                    elif o[0] == "get":
                        dst = bytearray(len(keys) * NS.block_bytes)
                        h = t.get_into(NS, keys, dst)
                        assert h == model.prefix(keys)
                        assert bytes(dst[: h * NS.block_bytes]) == rows(NS, keys[:h])
                        model.stamp(keys[:h])
                    else:
                        t.touch(NS, keys)
                        model.stamp([k for k in keys if model.live(k)])
                elif o[0] == "advance":
                    clock.advance(o[1])
                elif o[0] == "sweep":
                    expired = [k for k in model.bucket if not model.live(k)]
                    assert t.sweep() == len(expired)
                    for k in expired:
                        del model.bucket[k]
                elif o[0] == "reopen":
                    t.close()
                    t = SSDTier(cfg)
                    t.register(NS)
                elif o[0] == "delete":
                    assert t.delete_namespace(NS) == len(model.bucket)
                    model.bucket.clear()
                for c in CHAINS:
                    assert t.contains(NS, c) == model.prefix(c)
            t.check_integrity()
            assert set(t.iter_keys(NS)) == set(model.bucket)
        finally:
            t.close()
