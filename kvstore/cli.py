"""``kvstore`` command line: one subcommand per module, loaded lazily.

Each command module defines ``configure(parser)`` and ``run(args) -> int``; this file
only wires them together, prints bad input as one line, and sets the exit status, so a
command's own module never has to think about either.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from collections.abc import Sequence
from typing import Any

from kvstore.errors import KVStoreError
from kvstore.flags import OneLineParser, quiet_grpc_core
from kvstore.textfile import read_text

# Commands that run no gRPC server: gRPC's C-core logging stays off their terminal.
GRPC_CLIENTS = frozenset({"demo", "stats", "hitrate", "loadgen"})

# name -> (module, one-line help). Modules are imported only when their command runs,
# so `kvstore hitrate` never pays for gRPC and `kvstore serve` never for matplotlib.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("kvstore.demo", "multi-turn agent conversation through an embedded store"),
    "serve": ("kvstore.daemon.cli", "run the cache daemon (gRPC)"),
    "node": ("storage_nodes.node.cli", "run a storage node daemon (gRPC)"),
    "stats": ("clients.stats_cli", "print a running daemon's statistics"),
    "hitrate": ("kvstore.hitrate.cli", "replay traffic logs through simulated tiers"),
    "loadgen": ("kvstore.loadgen.cli", "replay a trace against a running daemon"),
}


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each flag's default, except where there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or (isinstance(default, list) and not default)
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(OneLineParser):
    """A command's parser that keeps, by destination, the action each of its flags made
    (what ``add_argument`` returns): a config file's keys are checked against them.
    Command modules add their flags with ``add_argument`` on the parser itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: dict[str, argparse.Action] = {}  # before: __init__ adds --help
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags[action.dest] = action
        return action


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


def load_config(path: str) -> dict[str, Any]:
    """A TOML config whose keys are flag names (``ssd-dir`` or ``ssd_dir``)."""
    text = read_text(path, "--config")  # names the file when it is missing or not text
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"invalid TOML in {path}: {e}") from None
    return {k.replace("-", "_"): v for k, v in data.items()}


def config_defaults(sub: CommandParser, cfg: dict[str, Any], path: str) -> dict[str, Any]:
    """TOML values as the strings a command line would give, checked against each flag:
    a switch takes true/false; a list becomes ``a,b`` (``nodes = ["h:1", "h:2"]``); numbers
    become their text, so sizes and durations go through the same parsers as flags. A
    repeatable flag (``--sweep``) takes a string or a list, each item one use of the flag:
    its default is the list argparse would have built."""
    actions = sub.flags
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        action = actions[key]
        where = f"{path}: {key}"
        if action.nargs == 0:  # a switch: store_true / store_false
            if not isinstance(value, bool):
                raise UsageError(f"{where}: expected true or false, got {value!r}")
            out[key] = value
            continue
        if isinstance(value, list):
            if not all(_scalar(v) for v in value):
                raise UsageError(f"{where}: expected a list of strings or numbers")
        elif not _scalar(value):
            raise UsageError(f"{where}: expected a string or a number, got {value!r}")
        items = value if isinstance(value, list) else [value]
        if _repeatable(action):
            # A list default, not "a,b": argparse's append default is the list of uses
            # (a string there would be iterated per character: "invalid --sweep 'd'").
            out[key] = [_flag_text(action, str(v), where) for v in items]
        else:
            out[key] = _flag_text(action, ",".join(str(v) for v in items), where)
    return out


def _repeatable(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)  # what action="append" makes


def _flag_text(action: argparse.Action, text: str, where: str) -> str:
    """``text`` checked with the flag's ``type=``, as the command line would be."""
    if callable(action.type):
        try:
            action.type(text)
        except argparse.ArgumentTypeError as e:  # a flag_type: its parser's message
            raise UsageError(f"{where}: {e}") from None
        except (TypeError, ValueError):
            raise UsageError(f"{where}: invalid value {text!r}") from None
    return text


def apply_config(
    sub: CommandParser, path: str, given: argparse.Namespace | None = None
) -> None:
    """Make the TOML file ``path``'s values ``sub``'s defaults (parse again after: flags
    given on the command line still win); a key that names no flag is a ``UsageError``.
    ``given``, the parse without the config, says which repeatable flags the command line
    gave: argparse appends those to a list default, so the config's are dropped instead."""
    cfg = load_config(path)
    unknown = sorted(set(cfg) - set(sub.flags))
    if unknown:
        raise UsageError(f"{path}: unknown keys {', '.join(unknown)}")
    defaults = config_defaults(sub, cfg, path)
    if given is not None:
        for key in [k for k in defaults if _repeatable(sub.flags[k])]:
            if getattr(given, key, None) is not None:
                del defaults[key]
    sub.set_defaults(**defaults)


def _scalar(v: object) -> bool:
    return isinstance(v, (str, int, float)) and not isinstance(v, bool)


def build_parser(
    command: str | None = None,
) -> tuple[argparse.ArgumentParser, dict[str, CommandParser]]:
    """The top parser and one subparser per available command.

    Only ``command``'s module is imported and configured: the others are listed with
    their one-line help, so ``kvstore hitrate`` never pays for torch or gRPC imports.
    """
    parser = OneLineParser(
        prog="kvstore",
        description="Tiered KV-cache store: HBM, host DRAM and an SSD cluster with 72 h retention.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    subparsers: dict[str, CommandParser] = {}
    for name, (mod, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=_HelpFormatter)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--config", metavar="FILE.toml", help="read flag defaults from a TOML file")
        if name == command:
            importlib.import_module(mod).configure(p)
        p.set_defaults(_module=mod)
        subparsers[name] = p
    return parser, subparsers


def _command_in(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    if command in GRPC_CLIENTS:
        quiet_grpc_core()  # before build_parser imports the command's module (and grpc)
    parser, subparsers = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        if args.config:
            # Config values are defaults; flags given on the command line still win.
            apply_config(subparsers[args.command], args.config, args)
            args = parser.parse_args(argv)
        return int(importlib.import_module(args._module).run(args) or 0)
    except (UsageError, KVStoreError, ValueError) as e:
        print(f"kvstore {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path or address of this machine the command cannot use
        where = f": {e.filename}" if e.filename else ""
        print(f"kvstore {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except RecursionError:
        print(f"kvstore {args.command}: error: input nested too deeply", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
