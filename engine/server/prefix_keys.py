"""How ``kvengine serve`` hashes its chain keys: xxh3 for one user, keyed blake2b for many.

A server with several users (``--auth-token-file`` naming two or more tenants) must not let
one user aim a key collision at another's blocks (``kvstore.prefix_key`` says why), so its
chain keys are ``blake2b_128`` keyed with the deployment's secret (``--prefix-key-file``),
by default. Without the key file it refuses to start (one line, exit 2) unless the operator
opts out with ``--prefix-hash xxh3``. A key file given to a single-user server is used too:
every engine of a deployment that shares a store must hash alike to share its blocks.
"""

from __future__ import annotations

import argparse
import logging

from engine.errors import EngineInputError
from kvstore.errors import InvalidArgument
from kvstore.prefix_key import MAKE_KEY, XXH3, PrefixHash, load_prefix_key
from kvstore.rpcserver.auth import load_token_file

MODES = ("auto", "xxh3", "blake2b")
log = logging.getLogger("engine.server")


def add_prefix_key_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefix-key-file", metavar="F",
                   help="the deployment's secret for keyed (blake2b) chain keys, shared by "
                        f"every engine on the store; make one with `{MAKE_KEY}`")
    p.add_argument("--prefix-hash", choices=MODES, default="auto",
                   help="chain-key hash: auto (the default) is blake2b keyed with "
                        "--prefix-key-file when given or when --auth-token-file names two or "
                        "more tenants (then the key file is required), else xxh3; xxh3 "
                        "opts a multi-user server out (keys not collision-resistant)")


def http_users(token_file: str | None) -> int:
    """Distinct tenants of ``--auth-token-file`` (1 without one: the anonymous user)."""
    if token_file is None:
        return 1
    try:
        return len(load_token_file(token_file).tenants)
    except InvalidArgument as e:
        raise EngineInputError(f"--auth-token-file: {e}") from None


def prefix_hash(mode: str, key_file: str | None, users: int) -> PrefixHash:
    """The chain-key hash of a server with ``users`` tenants (see the module docstring)."""
    if mode not in MODES:
        raise EngineInputError(f"--prefix-hash {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "xxh3":
        if key_file is not None:
            raise EngineInputError("--prefix-hash xxh3 takes no --prefix-key-file")
        if users > 1:
            log.warning("%d tenants share xxh3 chain keys (--prefix-hash xxh3): keys are not "
                        "collision-resistant", users)
        return XXH3
    if key_file is None:
        if mode == "blake2b":
            raise EngineInputError(f"--prefix-hash blake2b needs --prefix-key-file "
                                   f"(make one with: {MAKE_KEY})")
        if users > 1:
            raise EngineInputError(
                f"--auth-token-file names {users} tenants: their chain keys must be keyed — "
                f"give --prefix-key-file F (make one with: {MAKE_KEY}), or opt out with "
                "--prefix-hash xxh3")
        return XXH3
    try:
        secret = load_prefix_key(key_file)
    except InvalidArgument as e:
        raise EngineInputError(f"--prefix-key-file: {e}") from None
    return PrefixHash("blake2b_128", secret)
