"""``kvstore`` command line: every bad input is one line on stderr and exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.cli import main


def run_bad(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own exit
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "argv, line",
    [
        # Issue 36 (item 8): argparse printed its 16-line usage block first.
        (
            ["serve", "--workers", "abc"],
            "kvstore serve: error: --workers: invalid int value: 'abc' (see kvstore serve --help)",
        ),
        (
            ["stats", "--nope"],
            "kvstore stats: error: unrecognized arguments: --nope (see kvstore stats --help)",
        ),
        (
            ["hitrate"],
            "kvstore hitrate: error: the following arguments are required: LOG"
            " (see kvstore hitrate --help)",
        ),
    ],
)
def test_argparse_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    assert run_bad(capsys, argv) == line


@pytest.mark.parametrize(
    "argv",
    [
        ["stats", "--config", "{blob}"],
        ["hitrate", "x.jsonl", "--config", "{blob}"],
        ["stats", "--store", "grpc://127.0.0.1:1", "--auth-token-file", "{blob}"],
        ["serve", "--listen", "127.0.0.1:0", "--dram", "1MiB", "--auth-token-file", "{blob}"],
    ],
)
def test_a_binary_file_is_named_in_its_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    # Issue 36 (item 5): "'utf-8' codec can't decode byte 0xff…", naming no file.
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"\xff\xfe\x00binary")
    line = run_bad(capsys, [a.format(blob=blob) for a in argv])
    flag = argv[argv.index("{blob}") - 1]
    assert f"error: {flag} {blob}: cannot read (not UTF-8 text" in line, line
