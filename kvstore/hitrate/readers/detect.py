"""Turn ``LOG…`` arguments (files, directories, globs) into one reader."""

from __future__ import annotations

import glob
import importlib
import os
from collections.abc import Sequence

from kvstore.hitrate.errors import ConfigError, InputNotFound
from kvstore.hitrate.readers.base import TraceReader
from kvstore.hitrate.readers.sniff import sniff_format

# format -> (module, class), imported on use: a JSONL replay never pays for pyarrow.
FORMATS: dict[str, tuple[str, str]] = {
    "mooncake": ("kvstore.hitrate.readers.mooncake", "MooncakeReader"),
    "kv-cache-tester": ("kvstore.hitrate.readers.kvcache_tester", "KvCacheTesterReader"),
    "access-log": ("kvstore.hitrate.readers.access_log", "AccessLogReader"),
}
ALIASES = {"kvct": "kv-cache-tester"}

# Files a directory contributes; others (an access log's open ``.tmp``, notes) are skipped.
DIRECTORY_SUFFIXES = (".json", ".jsonl", ".parquet", ".arrow", ".feather", ".ipc", ".arrows")


def _file_name_order(path: str) -> tuple[str, str]:
    return (os.path.basename(path), path)


def expand(inputs: Sequence[str]) -> list[str]:
    """Files named by ``inputs``, deduplicated, in file-name order (DESIGN §10's tie rule)."""
    if not inputs:
        raise InputNotFound("no input files given")
    found: list[str] = []
    for arg in inputs:
        if os.path.isdir(arg):
            names = [
                os.path.join(arg, n)
                for n in os.listdir(arg)
                if not n.startswith(".") and n.lower().endswith(DIRECTORY_SUFFIXES)
            ]
            files = [p for p in names if os.path.isfile(p)]
            if not files:
                raise InputNotFound(f"{arg}: directory holds no trace files")
            found.extend(files)
        elif os.path.exists(arg):
            found.append(arg)
        elif glob.has_magic(arg):
            files = [p for p in glob.glob(arg) if os.path.isfile(p)]
            if not files:
                raise InputNotFound(f"{arg}: no file matches")
            found.extend(files)
        else:
            raise InputNotFound(f"{arg}: no such file or directory")
    seen: set[str] = set()
    unique = []
    for p in found:
        real = os.path.realpath(p)
        if real not in seen:
            seen.add(real)
            unique.append(p)
    return sorted(unique, key=_file_name_order)


def open_inputs(
    inputs: Sequence[str], *, fmt: str = "auto", block_tokens: int | None = None
) -> TraceReader:
    """A reader over all inputs; every file must be of one format."""
    paths = expand(inputs)
    fmt = ALIASES.get(fmt, fmt)
    if fmt == "auto":
        kinds = {p: sniff_format(p) for p in paths}
        distinct = sorted(set(kinds.values()))
        if len(distinct) > 1:
            example = {k: next(p for p, v in kinds.items() if v == k) for k in distinct}
            listing = ", ".join(f"{k} ({example[k]})" for k in distinct)
            raise ConfigError(f"inputs mix formats {listing}; replay one format at a time")
        fmt = distinct[0]
    try:
        module, name = FORMATS[fmt]
    except KeyError:
        raise ConfigError(f"unknown format {fmt!r}; known: auto, {', '.join(FORMATS)}") from None
    cls: type[TraceReader] = getattr(importlib.import_module(module), name)
    return cls(paths, block_tokens=block_tokens)
