"""Property test: the cluster against a model of which node holds which block.

Random puts, reads and replica losses (a node dropping a whole namespace) on 3 real
nodes with R=2. The model places blocks with the same rendezvous ranking; a read must
return exactly the longest prefix of blocks some replica still holds, with the right
bytes. Read repair is off so that the model stays exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.keys import Key
from storage_nodes.cluster import ClusterConfig, ClusterTier
from storage_nodes.cluster.node_client import NodeClient
from tests.conftest import small_ns
from tests.storage_nodes.cluster.conftest import InprocNode, make_chain, read_back, rows

_ids = itertools.count()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[InprocNode]]:
    root: Path = tmp_path_factory.mktemp("model")
    made = [InprocNode(root / f"n{i}", 8 << 20) for i in range(3)]
    yield made
    for n in made:
        n.stop()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 5), st.integers(0, 8), st.integers(1, 8)),
        st.tuples(st.just("read"), st.integers(0, 5), st.integers(0, 8), st.integers(1, 8)),
        st.tuples(st.just("lose"), st.integers(0, 2), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(script=ops)
def test_cluster_matches_the_placement_model(
    nodes: list[InprocNode], script: list[tuple[str, int, int, int]]
) -> None:
    ns = small_ns(model_id=f"model-{next(_ids)}")  # a fresh namespace per example
    targets = tuple(n.target for n in nodes)
    tier = ClusterTier(ClusterConfig(nodes=targets, read_repair=False))
    direct = [NodeClient(t, tier.config) for t in targets]
    try:
        tier.register(ns)
        chains = [make_chain(ns, 16, seed=s) for s in range(6)]
        held: dict[Key, set[int]] = {}
        for op, c, start, n in script:
            if op == "lose":
                direct[c].delete(ns)
                for holders in held.values():
                    holders.discard(c)
                continue
            keys = chains[c][start : start + n]
            if op == "put":
                res = tier.put(ns, keys, rows(ns, keys))
                assert res.dropped == 0
                for k in keys:
                    held.setdefault(k, set()).update(tier.placement.top(k, 2))
            else:
                expect = 0
                while expect < len(keys) and held.get(keys[expect]):
                    expect += 1
                assert tier.contains(ns, keys) == expect
                assert read_back(tier, ns, keys) == (expect, True)
        tier.check_integrity()
    finally:
        tier.close()
        for d in direct:
            d.close()
