"""``kvstore.flags``: argparse errors as one line, and unit parsers as flag types."""

from __future__ import annotations

import argparse

import pytest

from kvstore.flags import OneLineParser, flag_type
from kvstore.units import parse_size


def one_line_error(
    capsys: pytest.CaptureFixture[str], parser: argparse.ArgumentParser, argv: list[str]
) -> str:
    with pytest.raises(SystemExit) as e:
        parser.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


def test_a_bad_value_is_one_line_with_a_pointer_to_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = OneLineParser(prog="tool")
    p.add_argument("--workers", type=int)
    assert one_line_error(capsys, p, ["--workers", "abc"]) == (
        "tool: error: --workers: invalid int value: 'abc' (see tool --help)"
    )


def test_an_unknown_flag_is_the_subcommands_error(capsys: pytest.CaptureFixture[str]) -> None:
    p = OneLineParser(prog="tool")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("run")
    assert one_line_error(capsys, p, ["run", "--nope"]) == (
        "tool run: error: unrecognized arguments: --nope (see tool run --help)"
    )


def test_flag_type_refuses_at_parse_time_with_the_parsers_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = OneLineParser(prog="tool")
    p.add_argument("--dram", type=flag_type(parse_size), default="1KiB")
    assert p.parse_args([]).dram == 1024
    err = one_line_error(capsys, p, ["--dram", "lots"])
    assert err.startswith("tool: error: --dram: invalid size 'lots'"), err
