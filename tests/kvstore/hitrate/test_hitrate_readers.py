"""Every input format, file expansion, and the DESIGN §10 merge order."""

from __future__ import annotations

from pathlib import Path

import pytest
from hitrate_files import (
    key,
    kvct_request,
    write_access_log,
    write_kvct,
    write_mooncake_arrow,
    write_mooncake_jsonl,
    write_mooncake_parquet,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.readers import open_inputs
from kvstore.hitrate.readers.detect import expand
from kvstore.hitrate.request import Request
from kvstore.hitrate.simulator import Simulator
from kvstore.units import Capacity

MOON = [(0, 1000, [1, 2]), (1500, 1100, [1, 2, 3]), (1500, 600, [1, 9]), (4000, 1024, [1, 2])]


def hits(reader_requests: list[Request], **cfg: object) -> int:
    sim = Simulator(SimConfig(**cfg))  # type: ignore[arg-type]
    sim.feed(reader_requests)
    return sim.result().hit_tokens


def test_mooncake_jsonl(tmp_path: Path) -> None:
    p = write_mooncake_jsonl(tmp_path / "t.jsonl", MOON)
    reader = open_inputs([str(p)])
    assert reader.format == "mooncake"
    reqs = list(reader.requests())
    assert [(r.time_s, r.input_tokens, list(r.keys), r.block_tokens) for r in reqs] == [
        (0.0, 1000, [1, 2], 512),
        (1.5, 1100, [1, 2, 3], 512),
        (1.5, 600, [1, 9], 512),
        (4.0, 1024, [1, 2], 512),
    ]
    # Weights follow each request's own L: request 2 (L = 1100) hits blocks 1, 2 in full
    # (1024), request 3 hits block 1 (512), request 4 hits both (1024).
    assert hits(reqs) == 1024 + 512 + 1024
    assert (
        list(r.block_tokens for r in open_inputs([str(p)], block_tokens=64).requests()) == [64] * 4
    )


@pytest.mark.parametrize("kind", ["parquet", "arrow-file", "arrow-stream"])
def test_mooncake_columns_in_parquet_and_arrow(tmp_path: Path, kind: str) -> None:
    want = list(open_inputs([str(write_mooncake_jsonl(tmp_path / "t.jsonl", MOON))]).requests())
    if kind == "parquet":
        p = write_mooncake_parquet(tmp_path / "t.parquet", MOON)
    else:
        p = write_mooncake_arrow(tmp_path / "t.arrow", MOON, stream=kind == "arrow-stream")
    reader = open_inputs([str(p)])
    assert reader.format == "mooncake"
    assert list(reader.requests()) == want


def test_mooncake_files_share_one_namespace_and_merge_by_time(tmp_path: Path) -> None:
    a = write_mooncake_jsonl(tmp_path / "a.jsonl", [(0, 512, [1]), (2000, 512, [2])])
    b = write_mooncake_jsonl(tmp_path / "b.jsonl", [(1000, 512, [1]), (2000, 512, [3])])
    reqs = list(open_inputs([str(b), str(a)]).requests())
    assert [(r.time_s, list(r.keys)) for r in reqs] == [(0, [1]), (1, [1]), (2, [2]), (2, [3])]
    assert hits(reqs) == 512  # b's id 1 is a's id 1


def test_kv_cache_tester_nested_requests_parent_first(tmp_path: Path) -> None:
    sub = {
        "t": 2.0,
        "type": "subagent",
        "requests": [kvct_request(2.0, 128, [5, 6]), kvct_request(3.0, 192, [5, 6, 7])],
    }
    parent_with_children = kvct_request(2.0, 64, [1], requests=[kvct_request(2.0, 64, [9])])
    p = write_kvct(
        tmp_path / "s.json",
        [kvct_request(0.0, 100, [1]), sub, parent_with_children, kvct_request(4.0, 130, [1, 2])],
    )
    reqs = list(open_inputs([str(p)]).requests())
    # One file: ids scoped by id * 1 + 0, i.e. unchanged.
    assert [(r.time_s, r.input_tokens, list(r.keys)) for r in reqs] == [
        (0.0, 100, [1]),
        (2.0, 128, [5, 6]),
        (2.0, 64, [1]),
        (2.0, 64, [9]),
        (3.0, 192, [5, 6, 7]),
        (4.0, 130, [1, 2]),
    ]
    assert all(r.block_tokens == 64 for r in reqs)
    # Hits: [1] at t=2 (64), [5, 6] at t=3 (128), [1] at t=4 (64; block 2 is new).
    assert hits(reqs) == 64 + 128 + 64


def test_kv_cache_tester_nested_request_without_time_inherits_the_parent(tmp_path: Path) -> None:
    child = {"type": "n", "in": 64, "hash_ids": [3]}
    p = write_kvct(tmp_path / "s.json", [kvct_request(7.0, 64, [1], requests=[child])])
    assert [r.time_s for r in open_inputs([str(p)]).requests()] == [7.0, 7.0]


def test_kv_cache_tester_files_are_separate_namespaces(tmp_path: Path) -> None:
    a = write_kvct(tmp_path / "a.json", [kvct_request(0.0, 64, [1])])
    b = write_kvct(tmp_path / "b.json", [kvct_request(1.0, 64, [1])])
    reqs = list(open_inputs([str(tmp_path)]).requests())
    assert len(reqs) == 2 and reqs[0].keys != reqs[1].keys
    assert hits(reqs) == 0
    assert hits(list(open_inputs([str(a), str(a)]).requests())) == 0  # deduplicated
    assert b.exists()


def test_kv_cache_tester_ties_in_file_name_order_then_request_order(tmp_path: Path) -> None:
    # One DRAM block: whichever t=0 request runs last owns it when a's t=1 request looks.
    write_kvct(tmp_path / "b.json", [kvct_request(0.0, 64, [1])])
    write_kvct(tmp_path / "a.json", [kvct_request(0.0, 64, [1]), kvct_request(1.0, 64, [1])])
    one_block = {"hbm": Capacity(bytes_=0), "dram": Capacity(tokens=64), "ssd": Capacity(bytes_=0)}
    reqs = list(open_inputs([str(tmp_path / "b.json"), str(tmp_path / "a.json")]).requests())
    assert hits(reqs, **one_block) == 0  # a's, then b's t=0 request: b evicts a's block
    # Within a file, request order: [1] then [2] at t=0 leaves [2] resident.
    p = write_kvct(
        tmp_path / "0.json",
        [kvct_request(0.0, 64, [1]), kvct_request(0.0, 64, [2]), kvct_request(1.0, 64, [1])],
    )
    reqs = list(open_inputs([str(p)]).requests())
    assert [list(r.keys) for r in reqs] == [[1], [2], [1]]
    assert hits(reqs, **one_block) == 0


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=1, max_size=5), min_size=1, max_size=4
    )
)
def test_merge_order_is_time_then_file_name_then_request(
    tmp_path_factory: pytest.TempPathFactory, sessions: list[list[float]]
) -> None:
    d = tmp_path_factory.mktemp("kvct")
    expected = []
    for f, times in enumerate(sessions):
        reqs = [kvct_request(t, 64, [1000 * f + i]) for i, t in enumerate(times)]
        write_kvct(d / f"s{f:02d}.json", reqs)
        expected += [(t, f, i) for i, t in enumerate(times)]
    expected.sort()  # time, then file name, then request order
    n = len(sessions)
    got = [
        (r.time_s, r.keys[0] % n, (r.keys[0] // n) % 1000) for r in open_inputs([str(d)]).requests()
    ]
    assert got == expected


def test_access_log(tmp_path: Path) -> None:
    p = write_access_log(
        tmp_path / "log-0001.parquet",
        [
            (1_000_000, 16, 40, [1, 2]),  # 40 tokens: blocks of 16, 16; an 8-token tail
            (2_000_000, 16, 0, [1, 2, 3]),  # prompt_tokens unknown: 3 full blocks
            (3_000_000, 16, 20, [1, 2]),  # block 2 weighs 4
        ],
    )
    reader = open_inputs([str(p)])
    assert reader.format == "access-log"
    reqs = list(reader.requests())
    assert [(r.time_s, r.input_tokens, r.block_tokens) for r in reqs] == [
        (1.0, 40, 16),
        (2.0, 48, 16),
        (3.0, 20, 16),
    ]
    assert list(reqs[0].keys) == [key(1), key(2)]
    assert hits(reqs) == 32 + 20


def test_access_log_directory_skips_unknown_files(tmp_path: Path) -> None:
    write_access_log(tmp_path / "log-0002.parquet", [(2_000_000, 16, 16, [1])])
    write_access_log(tmp_path / "log-0001.parquet", [(1_000_000, 16, 16, [1])])
    (tmp_path / "log-0003.parquet.tmp").write_bytes(b"partial")
    (tmp_path / ".hidden.parquet").write_bytes(b"x")
    assert [Path(p).name for p in expand([str(tmp_path)])] == [
        "log-0001.parquet",
        "log-0002.parquet",
    ]
    assert hits(list(open_inputs([str(tmp_path)]).requests())) == 16


def test_globs_and_file_name_order(tmp_path: Path) -> None:
    for name in ("c.jsonl", "a.jsonl", "b.jsonl"):
        write_mooncake_jsonl(tmp_path / name, [(0, 512, [1])])
    assert [Path(p).name for p in expand([str(tmp_path / "*.jsonl")])] == [
        "a.jsonl",
        "b.jsonl",
        "c.jsonl",
    ]
    assert [
        Path(p).name for p in expand([str(tmp_path / "c.jsonl"), str(tmp_path / "[ab].jsonl")])
    ] == [
        "a.jsonl",
        "b.jsonl",
        "c.jsonl",
    ]


def test_requests_can_be_read_twice(tmp_path: Path) -> None:
    reader = open_inputs([str(write_mooncake_jsonl(tmp_path / "t.jsonl", MOON))])
    assert list(reader.requests()) == list(reader.requests())
