"""``kvengine serve``'s chain-key hash (``engine/server/prefix_keys.py``): keyed blake2b by
default with two or more tenants, seen in the namespace the daemon registers; refusals of a
multi-user server without a key file and of bad key files (one line, exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import EngineInputError
from engine.server.prefix_keys import prefix_hash
from kvstore.daemon.catalog import FILE_NAME
from kvstore.prefix_key import XXH3, PrefixHash
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.wire.codec import ns_from_proto
from kvstore.wire.proto import kvstore_pb2 as pb
from tests.engine.server.conftest import MODEL, TOKENS, client, words
from tests.engine.server.serve_process import REPO, ServeProcess

SECRET = bytes(range(32))


def test_the_rules(prefix_key_file: Path) -> None:
    key = str(prefix_key_file)
    keyed = PrefixHash("blake2b_128", SECRET)
    assert prefix_hash("auto", None, 1) == XXH3  # one user: xxh3, as before
    assert prefix_hash("auto", key, 1) == keyed  # a key file given is used
    assert prefix_hash("auto", key, 2) == keyed
    assert prefix_hash("blake2b", key, 1) == keyed
    assert prefix_hash("xxh3", None, 3) == XXH3  # the explicit opt-out
    for mode, key_file, users, message in [
        ("auto", None, 2, "names 2 tenants: their chain keys must be keyed"),
        ("blake2b", None, 1, "needs --prefix-key-file"),
        ("xxh3", key, 1, "takes no --prefix-key-file"),
    ]:
        with pytest.raises(EngineInputError, match=message):
            prefix_hash(mode, key_file, users)


def serve_fails(tiny_dir: Path, *args: str) -> str:
    """``kvengine serve`` that must refuse: its stderr (one line), exit status 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", "serve", "--model", str(tiny_dir),
         "--listen", "127.0.0.1:0", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_refusals(tiny_dir: Path, token_file: Path, tmp_path: Path) -> None:
    line = serve_fails(tiny_dir, "--auth-token-file", str(token_file))
    assert "names 2 tenants" in line and "--prefix-key-file" in line and "openssl" in line
    open_key = tmp_path / "open.key"
    open_key.write_text(SECRET.hex())
    open_key.chmod(0o644)
    line = serve_fails(tiny_dir, "--auth-token-file", str(token_file),
                       "--prefix-key-file", str(open_key))
    assert "readable by every user" in line and str(open_key) in line
    short = tmp_path / "short.key"
    short.write_text("00112233")
    short.chmod(0o600)
    line = serve_fails(tiny_dir, "--prefix-key-file", str(short))
    assert "4 bytes of key, need 16 to 64" in line


def registered(ssd_dir: Path) -> list:
    """The namespaces the daemon's catalogue holds (``+ <NamespaceSpec hex>`` lines)."""
    out = []
    for line in (ssd_dir / FILE_NAME).read_text().splitlines():
        op, _, arg = line.partition(" ")
        if op == "+":
            out.append(ns_from_proto(pb.NamespaceSpec.FromString(bytes.fromhex(arg))))
    return out


def test_two_tenants_register_blake2b_namespaces(tiny_dir: Path, token_file: Path,
                                                 prefix_key_file: Path, env: dict[str, str],
                                                 tmp_path: Path) -> None:
    store_tokens = tmp_path / "store-tokens"
    engine_token = "e" * 32
    store_tokens.write_text(f"{engine_token} engine-1/*\n")
    (tmp_path / "engine-token").write_text(engine_token + "\n")
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    with (DaemonProcess(["--dram", "64MiB", "--ssd-dir", str(ssd), "--ssd-capacity", "64MiB",
                         "--auth-token-file", str(store_tokens)]) as daemon,
          ServeProcess(["--model", str(tiny_dir), "--kv-store", daemon.url,
                        "--auth-token-file", str(token_file),
                        "--prefix-key-file", str(prefix_key_file),
                        "--store-token-file", str(tmp_path / "engine-token"),
                        "--pool-tokens", "4096"], env) as srv):
        for tenant in ("alice", "bob"):
            client(srv, TOKENS[tenant]).completions.create(
                model=MODEL, prompt=words(150, seed=3), max_tokens=2, temperature=0)
        assert not any("kv store" in line for line in srv.stderr_lines), srv.stderr_lines
    by_tenant = {ns.tenant: ns for ns in registered(ssd)}
    assert {"engine-1/alice", "engine-1/bob"} <= set(by_tenant), by_tenant
    for tenant in ("engine-1/alice", "engine-1/bob"):
        ns = by_tenant[tenant]
        assert ns.hash_alg == "blake2b_128" and ns.prefix_secret is None  # never sent
