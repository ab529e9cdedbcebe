"""The model revision that enters the store namespace (DESIGN §3, §11).

``revision = xxh3_128(msgpack([per-file digests, KV-changing config fields, kv dtype]))``:
two checkpoints share cached KV only when their tensor bytes, the config fields that change
K/V (RoPE, windows, head shapes, …) and the dtype agree. A file's digest is the xxh3-128 of
its bytes (header included, so tensor names, shapes and dtypes count too); it is cached by
(resolved path, size, mtime, inode) in a small JSON file under the user's cache directory, so a
large checkpoint is read for it once.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import torch
import xxhash
from tqdm import tqdm

from engine.model.config import ModelConfig

_CHUNK_BYTES = 8 << 20
_CACHE_FILE = "file-digests.json"
_FORMAT = 1  # bump when the revision's inputs change


def default_cache_dir() -> Path:
    """``$KVENGINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvengine``, else ``~/.cache/kvengine``."""
    env = os.environ.get("KVENGINE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvengine"


class DigestCache:
    """File digests keyed by resolved path, valid while size and mtime are unchanged."""

    def __init__(self, cache_dir: str | Path | None) -> None:
        self.path = Path(cache_dir or default_cache_dir()) / _CACHE_FILE
        self.entries: dict[str, Any] = {}
        self.dirty = False
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                self.entries = data
        except (OSError, ValueError):
            pass  # no cache yet, or an unreadable one: recompute

    def get(self, path: Path, st: os.stat_result) -> str | None:
        entry = self.entries.get(str(path))
        if (isinstance(entry, dict) and entry.get("size") == st.st_size
                and entry.get("mtime_ns") == st.st_mtime_ns and entry.get("ino") == st.st_ino):
            digest = entry.get("xxh3_128")
            return digest if isinstance(digest, str) else None
        return None

    def put(self, path: Path, st: os.stat_result, digest: str) -> None:
        self.entries[str(path)] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                   "ino": st.st_ino, "xxh3_128": digest}
        self.dirty = True

    def save(self) -> None:
        """Write atomically; a cache that cannot be written only costs a recomputation."""
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".digests-")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.entries, fh)
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError:
            pass


def file_digest(path: Path, progress: bool = False) -> str:
    h = xxhash.xxh3_128()
    size = path.stat().st_size
    with open(path, "rb") as fh, tqdm(total=size, unit="B", unit_scale=True,
                                      desc=f"hashing {path.name}", disable=not progress) as bar:
        while chunk := fh.read(_CHUNK_BYTES):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def model_revision(
    files: list[Path],
    cfg: ModelConfig,
    dtype: torch.dtype,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> str:
    """The hex revision of a checkpoint loaded as ``dtype``."""
    cache = DigestCache(cache_dir)
    digests = []
    for path in files:
        resolved = path.resolve()
        st = resolved.stat()
        digest = cache.get(resolved, st)
        if digest is None:
            digest = file_digest(resolved, progress)
            cache.put(resolved, st, digest)
        digests.append([path.name, digest])
    cache.save()
    payload = [_FORMAT, digests, cfg.kv_fields(), str(dtype).removeprefix("torch.")]
    return xxhash.xxh3_128(msgpack.packb(payload, use_bin_type=True)).hexdigest()
