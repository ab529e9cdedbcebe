from __future__ import annotations

import math

import pytest

from kvstore.errors import InvalidArgument
from kvstore.units import (
    Capacity,
    format_bytes,
    parse_capacity,
    parse_duration,
    parse_size,
    parse_timeout,
)


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("4096", 4096),
        ("8GiB", 8 << 30),
        ("1.5KiB", 1536),
        ("512MB", 512_000_000),
        ("2 TiB", 2 << 40),
        ("1PiB", 1 << 50),
        (0, 0),
        ("7kb", 7000),
    ],
)
def test_sizes(text, expect) -> None:
    assert parse_size(text) == expect


def test_capacities() -> None:
    assert parse_capacity("inf").unbounded
    assert parse_capacity("3Mtok") == Capacity(tokens=3_000_000)
    assert parse_capacity("3000000tok").tokens == 3_000_000
    assert parse_capacity("inf").blocks(64, 890) == math.inf
    assert parse_capacity("1MiB").blocks(512, 2) == (1 << 20) // 1024
    assert parse_capacity("1000tok").blocks(64, 890) == 15
    assert parse_capacity(0).blocks(64, 890) == 0


@pytest.mark.parametrize("bad", ["", "8GiBs", "-1", "x", "1e", "1.2.3MiB", True, -5])
def test_bad_sizes(bad) -> None:
    with pytest.raises(InvalidArgument):
        parse_capacity(bad)


def test_size_refuses_tokens_and_inf() -> None:
    with pytest.raises(InvalidArgument):
        parse_size("inf")
    with pytest.raises(InvalidArgument):
        parse_size("5tok")


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("90s", 90),
        ("15m", 900),
        ("72h", 259200),
        ("3d", 259200),
        ("10", 10),
        ("inf", math.inf),
        (2.5, 2.5),
    ],
)
def test_durations(text, expect) -> None:
    assert parse_duration(text) == expect


@pytest.mark.parametrize("bad", ["", "3y", "h", "-1s", -1])
def test_bad_durations(bad) -> None:
    with pytest.raises(InvalidArgument):
        parse_duration(bad)


def test_a_nan_duration_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="invalid duration"):
        parse_duration(math.nan)


@pytest.mark.parametrize(("text", "expect"), [("5", 5.0), ("0.5", 0.5), ("2m", 120.0), (3, 3.0)])
def test_timeouts(text, expect) -> None:
    assert parse_timeout(text) == expect


@pytest.mark.parametrize("bad", ["nan", "inf", "infinity", "0", "0s", "-1", "", math.nan, 0])
def test_a_timeout_is_finite_and_positive(bad) -> None:
    # Issue 36 (item 4): `kvstore stats --timeout nan` (or inf) reached gRPC as a deadline.
    with pytest.raises(InvalidArgument, match="a timeout is finite and positive"):
        parse_timeout(bad)


@pytest.mark.parametrize("bad", ["1.5", "1.0", ".5", "1.5B", "1.5 b", "1.5tok"])
def test_a_bare_fraction_is_not_a_size(bad) -> None:
    # Issue 36 (item 6): `dram = 1.5` in a config silently became 1 byte.
    with pytest.raises(InvalidArgument, match="is whole; give a unit for a fraction"):
        parse_capacity(bad)


def test_a_fraction_with_a_unit_is_a_size() -> None:
    assert parse_size("1.5KiB") == 1536
    assert parse_capacity("1.5Ktok") == Capacity(tokens=1500)
    assert parse_size("1024") == parse_size("1024B") == 1024


def test_format_bytes() -> None:
    assert format_bytes(256 << 10) == "256.0 KiB"
    assert format_bytes(12) == "12 B"
    assert format_bytes(math.inf) == "inf"
