"""``--retention`` over its whole accepted range (issue 14 item 2): ``0`` is refused
everywhere it can be given, ``90s`` and ``72h`` expire on time, ``inf`` never expires —
through the SSD config, ``open_embedded``, ``kvstore serve``'s config and ``kvstore node``'s.
Before the fix ``inf`` was accepted and then every SSD call raised on ``int(nan)``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvstore.daemon.cli import config_from_args as serve_config
from kvstore.daemon.cli import configure as serve_arguments
from kvstore.daemon.store_factory import open_store
from kvstore.embedded import open_embedded
from kvstore.errors import InvalidArgument
from kvstore.units import parse_duration
from storage_nodes.node.cli import config_from_args as node_config
from storage_nodes.node.cli import configure as node_arguments
from storage_nodes.ssd import SSDConfig, SSDConfigError, SSDTier
from tests.storage_nodes.ssd.helpers import FakeClock, chain, make_config, rows, small_ns

HOUR = 3600.0
YEAR = 365 * 24 * HOUR


@pytest.mark.parametrize(
    ("text", "expires_after_s"), [("90s", 90.0), ("72h", 72 * HOUR), ("inf", math.inf)]
)
def test_tier_honours_each_retention(tmp_path: Path, text: str, expires_after_s: float) -> None:
    ns = small_ns()
    clock = FakeClock()
    t = SSDTier(make_config(tmp_path / "ssd", retention_s=parse_duration(text), clock=clock))
    try:
        t.register(ns)
        k = chain(ns, 6)
        assert t.put(ns, k, rows(ns, k)).inserted == 6
        t.touch(ns, k)
        assert t.sweep() == 0 and t.contains(ns, k) == 6
        dst = bytearray(6 * ns.block_bytes)
        # just inside retention (bucket granularity is one minute): still there
        clock.advance(min(expires_after_s, 10 * YEAR) - 120)
        assert t.get_into(ns, k, dst) == 6 and bytes(dst) == rows(ns, k)
        assert t.sweep() == 0
        clock.advance(min(expires_after_s, 10 * YEAR) + 180)  # idle past retention
        t.flush_touches()
        if math.isinf(expires_after_s):
            assert t.contains(ns, k) == 6 and t.sweep() == 0
            assert t.get_into(ns, k, dst) == 6
        else:
            assert t.contains(ns, k) == 0 and t.sweep() == 6
            assert t.stats().counters["expired_total"] == 6
        assert t.stats().info["retention_s"] == str(float(expires_after_s))
        assert t.mode == "ok"
        t.check_integrity()
    finally:
        t.close()


def test_infinite_retention_evictions_are_all_violations(tmp_path: Path) -> None:
    """With ``inf`` every capacity eviction is of a block younger than its retention."""
    ns = small_ns()
    slab = 256 << 10
    t = SSDTier(make_config(tmp_path / "ssd", retention_s=math.inf, capacity_bytes=2 * slab))
    try:
        t.register(ns)
        for salt in range(6):
            k = chain(ns, 40, salt=salt)
            assert t.put(ns, k, rows(ns, k)).inserted == 40
        c = t.stats().counters
        assert c["evictions"] > 0 and c["expired_total"] == 0
        assert c["retention_violations_total"] == c["evictions"]
        t.check_integrity()
    finally:
        t.close()


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, -math.inf, True, "72h"])
def test_ssd_config_refuses_meaningless_retention(tmp_path: Path, bad: object) -> None:
    with pytest.raises(SSDConfigError, match="retention_s"):
        SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, retention_s=bad)  # type: ignore[arg-type]


def test_other_durations_stay_finite(tmp_path: Path) -> None:
    with pytest.raises(SSDConfigError, match="bucket_s must be finite"):
        SSDConfig(dir=tmp_path, capacity_bytes=1 << 30, bucket_s=math.inf)


@pytest.mark.parametrize("text", ["90s", "72h", "inf"])
def test_open_embedded_accepts_and_works(tmp_path: Path, text: str) -> None:
    ns = small_ns()
    store = open_embedded(
        dram_bytes=1 << 20,
        ssd_dir=str(tmp_path / "ssd"),
        ssd_capacity_bytes=8 << 20,
        retention_s=parse_duration(text),
    )
    try:
        store.register(ns)
        k = chain(ns, 4)
        data = rows(ns, k)
        b = ns.block_bytes
        r = store.commit(ns, k, {i: data[i * b : (i + 1) * b] for i in range(4)}, durability="ssd")
        assert r.inserted == 4 and r.durability == "ssd"
        ssd = store.tiers[-1]
        assert ssd.name == "ssd" and ssd.contains(ns, k) == 4
        assert ssd.stats().info["mode"] == "ok"
    finally:
        store.close()


def test_open_embedded_refuses_zero(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="retention"):
        open_embedded(1 << 20, ssd_dir=str(tmp_path), ssd_capacity_bytes=8 << 20, retention_s=0)


def _parse(add, args: list[str]):  # type: ignore[no-untyped-def]
    import argparse

    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(args)


@pytest.mark.parametrize("text", ["90s", "72h", "inf"])
def test_kvstore_serve_retention(tmp_path: Path, text: str) -> None:
    ns = small_ns()
    args = _parse(
        serve_arguments,
        [
            "--ssd-dir",
            str(tmp_path / "ssd"),
            "--ssd-capacity",
            "8MiB",
            "--dram",
            "1MiB",
            "--retention",
            text,
        ],
    )
    config = serve_config(args)
    assert config.retention_s == parse_duration(text)
    store = open_store(config)
    try:
        store.register(ns)
        k = chain(ns, 3)
        data = rows(ns, k)
        b = ns.block_bytes
        r = store.commit(ns, k, {i: data[i * b : (i + 1) * b] for i in range(3)}, durability="ssd")
        assert r.durability == "ssd"
        ssd = store.tiers[-1]  # type: ignore[attr-defined]
        assert ssd.config.retention_s == parse_duration(text) and ssd.contains(ns, k) == 3
    finally:
        store.close()


@pytest.mark.parametrize("text", ["90s", "72h", "inf"])
def test_kvstore_node_retention(tmp_path: Path, text: str) -> None:
    ns = small_ns()
    config = node_config(
        _parse(
            node_arguments,
            ["--dir", str(tmp_path / "n"), "--capacity", "8MiB", "--retention", text],
        )
    )
    t = SSDTier(config.ssd_config())
    try:
        assert t.config.retention_s == parse_duration(text)
        t.register(ns)
        k = chain(ns, 3)
        assert t.put(ns, k, rows(ns, k)).inserted == 3 and t.contains(ns, k) == 3
    finally:
        t.close()


@pytest.mark.parametrize("which", ["serve", "node"])
def test_zero_retention_is_refused_by_the_commands(tmp_path: Path, which: str) -> None:
    if which == "serve":
        args = _parse(
            serve_arguments,
            ["--ssd-dir", str(tmp_path), "--ssd-capacity", "8MiB", "--retention", "0"],
        )
        with pytest.raises(InvalidArgument, match="retention"):
            serve_config(args)
    else:
        args = _parse(node_arguments, ["--dir", str(tmp_path), "--retention", "0s"])
        with pytest.raises(InvalidArgument, match="retention"):
            node_config(args)
