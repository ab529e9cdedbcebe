"""The one token-file reader, shared by the clients and the cluster's node client, and the
CA file reader of every TLS channel."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clients.config import read_token
from kvstore.errors import InvalidArgument
from kvstore.wire.channel import channel_credentials, read_ca_file, token_from_file
from tests.conftest import self_signed_cert


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


@pytest.mark.parametrize("content", [b"not a pem\n", b"", b"\x30\x82\x01\x0a", None])
def test_a_ca_file_without_a_certificate_is_named(tmp_path: Path, content: bytes | None) -> None:
    # Issue 36 (item 2): gRPC took any bytes, logged C-core lines and blamed the connection.
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InvalidArgument, match=f"^TLS CA file {path}: "):
        channel_credentials(True, str(path))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_a_pem_ca_file_is_read(tmp_path: Path) -> None:
    cert, _ = self_signed_cert(tmp_path)
    assert read_ca_file(str(cert)) == cert.read_bytes()
    assert channel_credentials(True, str(cert)) is not None
    assert channel_credentials(False, str(tmp_path / "ignored")) is None
