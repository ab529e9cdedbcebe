"""The one token-file reader, shared by the clients and the cluster's node client."""

from __future__ import annotations

from pathlib import Path

import pytest

from clients.config import read_token
from kvstore.errors import InvalidArgument
from kvstore.wire.channel import token_from_file


def test_the_first_field_of_the_first_non_comment_line_is_the_token(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.write_text("# a comment\n\n  abc123  \nsecond\n")
    server_line = tmp_path / "server-line"
    server_line.write_text("abc123 tenant-a\n")
    assert token_from_file(str(bare), "--x") == token_from_file(str(server_line), "--x") == "abc123"
    # the client's reader is this one
    assert read_token(str(server_line)) == "abc123"


@pytest.mark.parametrize(
    "content, why",
    [
        (b"# only a comment\n\n", "holds no token"),
        (b"\xff\xfe token\n", "not UTF-8"),
        (None, "cannot read"),
    ],
)
def test_an_unusable_file_names_the_flag(tmp_path: Path, content: bytes | None, why: str) -> None:
    path = tmp_path / "tokens"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InvalidArgument, match=why) as e:
        token_from_file(str(path), "--auth-token-file")
    assert str(e.value).startswith(f"--auth-token-file {path}")
