"""What every command line of the project shares (``kvstore``, ``python -m
kvstore.hitrate``, ``kvengine``): bad input as one line, and flag types built on the
parsers of ``kvstore.units``.

argparse's own ``error`` prints the whole usage block (16 lines for ``kvstore serve``)
before the message; every other error of these commands is one line and exit status 2,
so a parser error is too, with a pointer to ``--help`` where the usage now lives.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import NoReturn, TypeVar

T = TypeVar("T")


def quiet_grpc_core() -> None:
    """Keep gRPC's C-core log lines (``E1205 … ssl_transport_security.cc…``) off the
    terminal of a command that is only a gRPC client: what went wrong reaches the user as
    the call's error, in one line. Read once, when grpc is first imported, so the entry
    point calls this before any command module loads; an operator's own GRPC_VERBOSITY
    still wins."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are ``PROG: error: MESSAGE (see PROG --help)``
    on one line, exit status 2. Subparsers made through ``add_subparsers`` inherit it."""

    def error(self, message: str) -> NoReturn:
        # argparse says "argument --workers: invalid int value: 'abc'": the flag is enough.
        text = " ".join(message.removeprefix("argument ").split())
        self.exit(2, f"{self.prog}: error: {text} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def, override]
        """As argparse's, but a flag the chosen command does not know is that command's
        error (``kvstore serve: error: unrecognized arguments…``), not the top parser's."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self._owner(parsed).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _owner(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):  # what add_subparsers returns
                sub = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(sub, OneLineParser):
                    return sub._owner(parsed)
        return self


def flag_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` (one of ``kvstore.units``' parsers) as an argparse ``type=``: a value it
    refuses is refused at parse time with its own message (argparse would otherwise say
    only "invalid parse_timeout value")."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:  # InvalidArgument is one
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__
    return convert
