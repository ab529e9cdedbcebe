"""Output text as tokens arrive: incremental detokenization and stop strings.

Decoding token by token breaks multi-byte characters and merged pieces, so the text is
always the decode of every output token so far and each event sends what grew. A text
ending in U+FFFD (a character cut in the middle) is held back until it completes. With
stop strings, the last ``longest stop − 1`` characters are held back too, so a stop string
split across tokens is never half sent; when one appears the text ends just before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class TextStream:
    def __init__(self, tokenizer: Decoder, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._ids: list[int] = []
        self._sent = 0  # characters of the text already returned
        self.text = ""
        self.stopped = False  # a stop string appeared: the output ends here

    def add(self, token_ids: Sequence[int]) -> str:
        """Take new tokens; returns the text that may be sent now."""
        if self.stopped:
            return ""
        self._ids.extend(token_ids)
        self.text = self.tokenizer.decode(self._ids, skip_special_tokens=True)
        cut = self._first_stop()
        if cut is not None:
            self.text = self.text[:cut]
            self.stopped = True
            return self._send(len(self.text))
        safe = len(self.text) - self._hold
        if self.text.endswith("\ufffd"):
            safe = min(safe, len(self.text) - 1)
        return self._send(safe)

    def finish(self) -> str:
        """The rest of the text, once no more tokens come."""
        return self._send(len(self.text))

    def _first_stop(self) -> int | None:
        # Search only where a new stop could start: after what was already sent.
        found = [i for s in self.stop if (i := self.text.find(s, max(0, self._sent))) >= 0]
        return min(found) if found else None

    def _send(self, upto: int) -> str:
        if upto <= self._sent:
            return ""
        out = self.text[self._sent : upto]
        self._sent = upto
        return out
