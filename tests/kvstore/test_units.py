from __future__ import annotations

import math

import pytest

from kvstore.errors import InvalidArgument
from kvstore.units import Capacity, format_bytes, parse_capacity, parse_duration, parse_size


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


def test_format_bytes() -> None:
    assert format_bytes(256 << 10) == "256.0 KiB"
    assert format_bytes(12) == "12 B"
    assert format_bytes(math.inf) == "inf"
