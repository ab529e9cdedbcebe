"""The warning on a non-loopback bind without auth, from the real server: ``kvengine serve
--listen 0.0.0.0:0`` without ``--auth-token-file`` says so on stderr; with it, it does not."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.engine.server.serve_process import ServeProcess

WARNING = "warning: listening on 0.0.0.0 without --auth-token-file"


@pytest.fixture(scope="module")
def any_address() -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
    except OSError as e:
        pytest.skip(f"cannot bind 0.0.0.0 here ({e.strerror}): no non-loopback address")
    return "0.0.0.0"


def serve_stderr(tiny_dir: Path, host: str, *extra: str) -> list[str]:
    with ServeProcess(["--model", str(tiny_dir), "--kv-store", "none", "--pool-tokens", "256",
                       *extra], listen_host=host) as server:
        pass
    return server.stderr_lines  # complete: stop() read stderr to its end


def test_non_loopback_bind_without_auth_warns(tiny_dir: Path, any_address: str) -> None:
    lines = serve_stderr(tiny_dir, any_address)
    assert sum(WARNING in line for line in lines) == 1, lines


def test_non_loopback_bind_with_auth_does_not_warn(tiny_dir: Path, any_address: str,
                                                   tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-token-0123456789 alice\n")
    lines = serve_stderr(tiny_dir, any_address, "--auth-token-file", str(tokens))
    assert not any("warning" in line for line in lines), lines


def test_loopback_bind_without_auth_does_not_warn(tiny_dir: Path) -> None:
    lines = serve_stderr(tiny_dir, "127.0.0.1")
    assert not any("warning" in line for line in lines), lines
