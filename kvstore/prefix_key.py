"""The deployment's prefix key: the secret of keyed chain keys (DESIGN §3, ``blake2b_128``).

Why keyed: xxh3 is fast but not collision-resistant, and anyone who knows a namespace's
fields (none of them secret) can compute its chain keys. On a server shared by several
users, a user who can make two prompts' keys collide can be served another user's KV, or
poison it (vLLM's prefix cache had exactly this: CVE-2025-25183, after which it moved to
SHA-256). With ``blake2b(digest_size=16, key=secret)`` nobody without the secret can
compute a key, let alone aim a collision at one. Every engine of a deployment (``kvengine
serve``, vLLM through ``clients.vllm_connector``) reads the same key file, so their keys
stay equal and they keep hitting each other's blocks. The secret never leaves the process:
it is not a namespace field (the daemon never sees it), only ``hash_alg`` is.

The file: 16 to 64 random bytes, raw or as hex text, readable by its owner (and group)
only. Make one with ``openssl rand -hex 32 > prefix.key && chmod 600 prefix.key``.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import string
from dataclasses import dataclass

from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace

MIN_KEY_BYTES = 16  # 128 bits: the digest's own strength
MAX_KEY_BYTES = 64  # blake2b's key limit
MAKE_KEY = "openssl rand -hex 32 > prefix.key && chmod 600 prefix.key"


def load_prefix_key(path: str) -> bytes:
    """The secret in ``path``; ``InvalidArgument`` (one line naming the file) when it is
    missing, readable by others, or not 16 to 64 bytes (raw, or hex text)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(4 * MAX_KEY_BYTES + 3)
    except OSError as e:
        raise InvalidArgument(f"prefix key file {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument(f"prefix key file {path}: not a regular file")
    if st.st_mode & stat.S_IROTH:
        raise InvalidArgument(
            f"prefix key file {path} is readable by every user (mode "
            f"{stat.S_IMODE(st.st_mode):03o}): chmod 600 {path}"
        )
    key = _decode(data)
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InvalidArgument(
            f"prefix key file {path}: {len(key)} bytes of key, need {MIN_KEY_BYTES} to "
            f"{MAX_KEY_BYTES} (make one with: {MAKE_KEY})"
        )
    return key


def _decode(data: bytes) -> bytes:
    """Hex text (``openssl rand -hex``, trailing newline allowed) or raw bytes as they are."""
    text = data.rstrip(b"\r\n")
    if text and len(text) % 2 == 0 and all(chr(c) in string.hexdigits for c in text):
        return bytes.fromhex(text.decode())
    return data


@dataclass(frozen=True, slots=True)
class PrefixHash:
    """How an engine's chain keys are hashed: ``xxh3_128`` (single user) or ``blake2b_128``
    keyed with the deployment's secret. ``apply`` puts it on a namespace."""

    alg: str = "xxh3_128"
    secret: bytes | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.alg == "blake2b_128") != (self.secret is not None):
            raise InvalidArgument("blake2b_128 prefix keys need a secret, and only they do")

    @classmethod
    def of(cls, ns: Namespace) -> PrefixHash:
        return cls(ns.hash_alg, ns.prefix_secret)

    def apply(self, ns: Namespace) -> Namespace:
        if (ns.hash_alg, ns.prefix_secret) == (self.alg, self.secret):
            return ns
        return dataclasses.replace(ns, hash_alg=self.alg, prefix_secret=self.secret)


XXH3 = PrefixHash()
