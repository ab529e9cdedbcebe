"""``python -m kvstore.hitrate LOG…``: the ``kvstore hitrate`` command on its own.

Same flags, output and exit codes as ``kvstore hitrate`` (errors one line, status 2), but
it loads only this command, so a quick replay does not pay for the other subcommands'
imports (torch, gRPC).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from kvstore.cli import CommandParser, UsageError, apply_config
from kvstore.errors import KVStoreError
from kvstore.hitrate.cli import configure, run

_PROG = "kvstore hitrate"


def main(argv: Sequence[str] | None = None) -> int:
    parser = CommandParser(
        prog=_PROG, description="replay traffic logs through simulated tiers"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--config", metavar="FILE.toml", help="read flag defaults from a TOML file")
    configure(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        if args.config:
            apply_config(parser, args.config, args)
            args = parser.parse_args(argv)
        return run(args)
    except (UsageError, KVStoreError, ValueError, FileNotFoundError, PermissionError) as e:
        print(f"{_PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
