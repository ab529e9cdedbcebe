"""Parsing of sizes and durations as DESIGN §9 spells them.

Sizes: an integer is bytes; units ``KiB MiB GiB TiB PiB`` (binary) and ``KB MB GB TB PB``
(decimal); a ``tok`` suffix means tokens (``3000000tok``, ``3Mtok``); ``inf`` is unbounded.
Durations: ``90s``, ``15m``, ``72h``, ``3d`` (a bare number is seconds); a timeout or
deadline (``parse_timeout``) is finite and positive.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvstore.errors import InvalidArgument

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "pib": 1 << 50,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
}
_TOKEN_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9, "t": 10**12}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(rf"^{_NUMBER}\s*([a-z]*)$")
_TOKENS_RE = re.compile(rf"^{_NUMBER}\s*([kmgbt]?)tok(?:ens?)?$")


@dataclass(frozen=True, slots=True)
class Capacity:
    """A tier capacity: bytes, tokens, or unbounded. Convert with ``blocks()``."""

    bytes_: int | None = None
    tokens: int | None = None

    @property
    def unbounded(self) -> bool:
        return self.bytes_ is None and self.tokens is None

    def blocks(self, block_tokens: int, bytes_per_token: float) -> float:
        """Capacity in blocks (``math.inf`` if unbounded), as DESIGN §10 rounds it."""
        if self.unbounded:
            return math.inf
        if self.tokens is not None:
            return self.tokens // block_tokens
        assert self.bytes_ is not None  # one of the two is set when bounded
        return math.floor(self.bytes_ / (block_tokens * bytes_per_token))

    def __str__(self) -> str:
        if self.unbounded:
            return "inf"
        if self.tokens is not None:
            return f"{self.tokens}tok"
        return format_bytes(self.bytes_ or 0)


def parse_size(text: str | int) -> int:
    """Parse a byte size (``8GiB``, ``512MB``, ``4096``). ``inf`` and tokens are refused."""
    cap = parse_capacity(text)
    if cap.bytes_ is None:
        raise InvalidArgument(f"expected a size in bytes, got {text!r}")
    return cap.bytes_


def parse_capacity(text: str | int) -> Capacity:
    """Parse a capacity: a byte size, a token count (``3Mtok``) or ``inf``."""
    if isinstance(text, bool):
        raise InvalidArgument(f"invalid size {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise InvalidArgument(f"size must not be negative: {text}")
        return Capacity(bytes_=text)
    s = text.strip().lower().replace("_", "")
    if s in ("inf", "infinity", "unbounded"):
        return Capacity()
    m = _TOKENS_RE.match(s)
    if m:
        _whole_unless_scaled(text, m.group(1), m.group(2), "tokens")
        return Capacity(tokens=int(float(m.group(1)) * _TOKEN_SCALE[m.group(2)]))
    m = _SIZE_RE.match(s)
    if not m or m.group(2) not in _BYTE_UNITS:
        raise InvalidArgument(
            f"invalid size {text!r}: use bytes, KiB/MiB/GiB/TiB/PiB, KB/MB/GB, 'Ntok' or 'inf'"
        )
    _whole_unless_scaled(text, m.group(1), m.group(2).removeprefix("b"), "bytes")
    return Capacity(bytes_=int(float(m.group(1)) * _BYTE_UNITS[m.group(2)]))


def _whole_unless_scaled(text: str | int, number: str, unit: str, what: str) -> None:
    """A count of bytes or tokens without a unit is a whole number: ``dram = 1.5`` in a
    config would otherwise become 1 byte, silently. ``1.5GiB`` is fine."""
    if not unit and "." in number:
        example = "1.5GiB" if what == "bytes" else "1.5Ktok"
        raise InvalidArgument(
            f"invalid size {text!r}: a number of {what} is whole; give a unit for a fraction"
            f" (e.g. {example})"
        )


def parse_duration(text: str | float | int) -> float:
    """Parse a duration into seconds: ``90s``, ``15m``, ``72h``, ``3d``, ``inf``."""
    if isinstance(text, bool):
        raise InvalidArgument(f"invalid duration {text!r}")
    if isinstance(text, int | float):
        if math.isnan(text):  # nan < 0 is False: it would pass as a duration
            raise InvalidArgument(f"invalid duration {text!r}")
        if text < 0:
            raise InvalidArgument(f"duration must not be negative: {text}")
        return float(text)
    s = text.strip().lower()
    if s in ("inf", "infinity", "forever"):
        return math.inf
    m = re.match(rf"^{_NUMBER}\s*([smhdw]?)$", s)
    if not m:
        raise InvalidArgument(f"invalid duration {text!r}: use e.g. 90s, 15m, 72h, 3d or inf")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2)]


def parse_timeout(text: str | float | int) -> float:
    """A timeout or deadline in seconds: a duration that is finite and positive. ``inf``
    or ``nan`` would reach gRPC as a deadline and end as "Deadline Exceeded"; 0 expires at
    once."""
    try:
        seconds = parse_duration(text)
    except InvalidArgument:
        seconds = math.nan
    if not 0 < seconds < math.inf:  # nan included
        raise InvalidArgument(
            f"invalid duration {text!r}: a timeout is finite and positive, e.g. 5s or 2m"
        )
    return seconds


def format_bytes(n: float) -> str:
    """Human-readable binary size, e.g. ``256.0 KiB``."""
    if n == math.inf:
        return "inf"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover - loop always returns
