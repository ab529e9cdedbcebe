"""``kvengine`` and ``python -m engine.cli``: the entry point the package installs
(``pyproject.toml``), kept at this path so the command and scripts that run the module keep
working; the command line itself is ``engine.entrypoints.cli``. It sets the OpenMP
environment torch starts with first (``engine.thread_env``)."""

from __future__ import annotations

import os
import sys

from engine.thread_env import set_thread_env_defaults

# Before torch loads (the import below): libgomp reads its wait policy only then.
set_thread_env_defaults(os.environ)

from engine.entrypoints.cli import main  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
