"""A checkpoint directory that appears whole or not at all.

``make-model`` and ``fetch-model`` write every file into a scratch directory beside the
target (same file system, so the final rename is atomic) and move it into place only once
all of it is written: a crash, a full disk or Ctrl-C leaves the target as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def scratch_beside(out: Path) -> Path:
    """A new empty directory next to ``out`` (a hidden ``.NAME.partial-*``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))


def install(written: Path, out: Path) -> None:
    """Move the finished directory ``written`` to ``out``, replacing what is there, with
    the permissions an ordinary ``save_pretrained`` gives (mkdtemp makes it 0700)."""
    for f in written.iterdir():
        f.chmod(0o644)
    written.chmod(0o755)
    if out.exists():
        shutil.rmtree(out)
    os.replace(written, out)
