"""``kvengine`` and ``python -m engine.cli``: the entry point the package installs
(``pyproject.toml``), kept at this path so the command and scripts that run the module keep
working; the command line itself is ``engine.entrypoints.cli``."""

from __future__ import annotations

import sys

from engine.entrypoints.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
