"""Run every ``bench/bench_*.py`` in turn (``make bench``); each prints its own table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    failed = []
    for script in sorted(Path(__file__).parent.glob("bench_*.py")):
        print(f"\n## {script.stem}\n", flush=True)
        if subprocess.run([sys.executable, "-m", f"bench.{script.stem}"]).returncode != 0:
            failed.append(script.stem)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
