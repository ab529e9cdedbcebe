"""The model revision: changes with the tensor bytes and the KV-changing config fields,
not with the rest; the file digest is computed once per (path, size, mtime, inode)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.model import load_model
from engine.model.make_model import make_model

WEIGHTS = "model.safetensors"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_model("qwen2", "tiny", tmp_path / "m", hybrid=True).path


def _revision(path: Path, cache: Path, **kw: object) -> str:
    return load_model(path, revision_cache_dir=cache, **kw).spec.revision  # type: ignore[arg-type]


def _edit_config(path: Path, **fields: object) -> None:
    raw = json.loads((path / "config.json").read_text())
    raw.update(fields)
    (path / "config.json").write_text(json.dumps(raw))


def test_digest_is_cached_by_path_size_and_mtime(model_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _revision(model_dir, cache)
    assert (cache / "file-digests.json").is_file()
    # Change a byte of the payload but keep size, inode and mtime: the cached digest is
    # used, which proves the file was not read again.
    weights = model_dir / WEIGHTS
    st = weights.stat()
    with open(weights, "r+b") as fh:
        fh.seek(st.st_size - 1)
        last = fh.read(1)
        fh.seek(st.st_size - 1)
        fh.write(bytes([last[0] ^ 0xFF]))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _revision(model_dir, cache) == first
    # A new mtime invalidates the entry: the changed bytes now give a new revision.
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    second = _revision(model_dir, cache)
    assert second != first
    # A fresh cache agrees with the recomputed value.
    assert _revision(model_dir, tmp_path / "fresh") == second


def test_kv_fields_change_the_revision_others_do_not(model_dir: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    base = _revision(model_dir, cache)
    assert _revision(model_dir, cache, dtype="bfloat16") != base
    _edit_config(model_dir, eos_token_id=1, max_position_embeddings=4096)
    assert _revision(model_dir, cache) == base  # stop tokens and context: same KV
    _edit_config(model_dir, sliding_window=64)
    windowed = _revision(model_dir, cache)
    assert windowed != base
    _edit_config(model_dir, sliding_window=128,
                 rope_parameters={"rope_type": "default", "rope_theta": 20000.0})
    assert _revision(model_dir, cache) not in (base, windowed)


def test_unwritable_cache_still_gives_the_revision(model_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert _revision(model_dir, blocker / "cache") == _revision(model_dir, tmp_path / "ok")
