"""The catalog against a model: whatever order records arrive in, it names exactly
the (owner, segment, slot) → key facts they leave, and its reverse maps agree."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from storage_nodes.sharedfs.catalog import Catalog, Loc

KEYS = [bytes([i]) * 16 for i in range(6)]
owners = st.sampled_from(["a", "b", "c"])
segs = st.integers(0, 2)
slots = st.integers(0, 3)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(KEYS), owners, segs, slots,
                  st.integers(0, 100), st.integers(0, 100)),
        st.tuples(st.just("drop"), st.sampled_from(KEYS), owners, segs, slots),
        st.tuples(st.just("drop_segment"), owners, segs),
        st.tuples(st.just("drop_owner"), owners),
        st.tuples(st.just("touch"), st.integers(0, 200), st.lists(st.sampled_from(KEYS))),
        st.tuples(st.just("delete"), st.integers(0, 100)),
    ),
    max_size=60,
)


@given(ops)
def test_catalog_matches_a_model_of_slots(seq) -> None:
    cat = Catalog()
    model: dict[tuple[str, int, int], tuple[bytes, int]] = {}  # slot -> (key, born)
    for op in seq:
        if op[0] == "put":
            _, k, o, s, sl, acc, born = op
            cat.put(k, Loc(o, s, sl, born), acc)
            model[(o, s, sl)] = (k, born)
        elif op[0] == "drop":
            _, k, o, s, sl = op
            cat.drop(k, o, s, sl)
            if model.get((o, s, sl), (None,))[0] == k:
                del model[(o, s, sl)]
        elif op[0] == "drop_segment":
            _, o, s = op
            cat.drop_segment(o, s)
            model = {p: v for p, v in model.items() if p[:2] != (o, s)}
        elif op[0] == "drop_owner":
            cat.drop_owner(op[1])
            model = {p: v for p, v in model.items() if p[0] != op[1]}
        elif op[0] == "touch":
            cat.touch(op[1], op[2])
        else:
            cat.drop_born_before(op[1])
            model = {p: v for p, v in model.items() if v[1] > op[1]}
        cat.check()
        held = {(loc.owner, loc.seg, loc.slot): k for k in KEYS for loc in cat.locations(k)}
        assert held == {p: v[0] for p, v in model.items()}
        assert set(cat.first) == {v[0] for v in model.values()}


def test_prefix_stops_at_the_first_missing_or_expired_key() -> None:
    cat = Catalog()
    for i, k in enumerate(KEYS[:4]):
        cat.put(k, Loc("a", 0, i, 0), access_s=100 if i != 2 else 10)
    assert len(cat.prefix(KEYS[:4], floor_s=50)) == 2
    assert len(cat.prefix(KEYS[:4], floor_s=0)) == 4
    assert cat.prefix([KEYS[5], *KEYS[:4]], floor_s=0) == []
    cat.touch(200, [KEYS[2]])
    assert len(cat.prefix(KEYS[:4], floor_s=50)) == 4


def test_a_second_copy_stands_in_when_the_first_goes() -> None:
    cat = Catalog()
    cat.put(KEYS[0], Loc("a", 0, 0, 1), 5)
    cat.put(KEYS[0], Loc("b", 9, 3, 2), 7)
    assert cat.first[KEYS[0]].owner == "a" and cat.access[KEYS[0]] == 7
    cat.drop_owner("a")
    assert cat.first[KEYS[0]] == Loc("b", 9, 3, 2)
    cat.put(KEYS[1], Loc("b", 9, 3, 2), 8)  # the slot is reused: KEYS[0] is gone
    assert KEYS[0] not in cat.first
    cat.check()
