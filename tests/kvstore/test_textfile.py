"""``kvstore.textfile.read_text``: the one reader of commands' text files names the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.errors import InvalidArgument
from kvstore.textfile import read_text


def test_text_is_read(tmp_path: Path) -> None:
    p = tmp_path / "a.txt"
    p.write_text("héllo\n", encoding="utf-8")
    assert read_text(p, "--x") == "héllo\n"


def test_a_binary_file_is_named_with_its_flag(tmp_path: Path) -> None:
    # Issue 36 (item 5): "'utf-8' codec can't decode byte 0xff…", naming no file.
    p = tmp_path / "blob.bin"
    p.write_bytes(b"ok\xff\xfe")
    with pytest.raises(InvalidArgument) as e:
        read_text(p, "--config")
    assert str(e.value) == f"--config {p}: cannot read (not UTF-8 text: byte 2)"


def test_a_missing_file_is_named_with_its_flag(tmp_path: Path) -> None:
    p = tmp_path / "nope"
    with pytest.raises(InvalidArgument, match=r"^--auth-token-file .*nope: cannot read \(No such"):
        read_text(p, "--auth-token-file")
