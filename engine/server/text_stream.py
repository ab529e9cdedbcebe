"""Output text as tokens arrive: incremental detokenization and stop strings.

Decoding token by token breaks multi-byte characters and merged pieces, so each new token is
decoded with the few tokens before it as context (``IncrementalDecoder``, as vLLM's
incremental detokenizer and transformers' ``TextStreamer``): the text grows by what the
window decodes to beyond its context, so a stream costs O(tokens), not a decode of every
token so far at each one. Text that ends in U+FFFD (a character cut in the middle) stays
pending until it completes. With
stop strings, the last ``longest stop − 1`` characters are held back too, so a stop string
split across tokens is never half sent; when one appears the text ends just before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDecoder:
    """The decode of every token added so far, kept up to date in O(new tokens) per call.

    ``ids[prefix:read]`` is context already in ``confirmed``; each call decodes
    ``ids[prefix:]`` and appends what it adds beyond the context's own decode (a piece
    whose text depends on its neighbours — a leading space, a merged byte — comes out as
    the full decode has it). While the addition ends in U+FFFD it stays ``pending``."""

    def __init__(self, tokenizer: Decoder) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self.confirmed = ""
        self.pending = ""  # decoded beyond ``confirmed`` but possibly incomplete

    def add(self, token_ids: Sequence[int]) -> None:
        self.ids.extend(token_ids)
        context = self._decode(self.ids[self._prefix : self._read])
        window = self._decode(self.ids[self._prefix :])
        grown = window[len(context):]
        if grown and not grown.endswith("\ufffd"):
            self.confirmed += grown
            self.pending = ""
            self._prefix, self._read = self._read, len(self.ids)
        else:
            self.pending = grown

    @property
    def text(self) -> str:
        return self.confirmed + self.pending

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""


class TextStream:
    def __init__(self, tokenizer: Decoder, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self._hold = max((len(s) for s in self.stop), default=1) - 1
        self._decoder = IncrementalDecoder(tokenizer)
        self._sent = 0  # characters of the text already returned
        self.text = ""
        self.stopped = False  # a stop string appeared: the output ends here

    def add(self, token_ids: Sequence[int]) -> str:
        """Take new tokens; returns the text that may be sent now."""
        if self.stopped:
            return ""
        self._decoder.add(token_ids)
        self.text = self._decoder.text
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
