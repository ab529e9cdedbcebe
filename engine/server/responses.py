"""Pieces of OpenAI response bodies: a choice's log probabilities, in the chat shape
(``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``) and the completions
shape (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.core.sequence import TokenLogprob
from engine.model.tokenizer import Tokenizer


def token_text(tok: Tokenizer, token_id: int) -> str:
    # One token's text as it decodes alone (special tokens written out, as vLLM).
    return tok.decode([token_id], skip_special_tokens=False)


def _entry(tok: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = token_text(tok, token_id)
    return {"token": text, "logprob": max(logprob, -9999.0), "bytes": list(text.encode())}


def chat_logprobs(tok: Tokenizer, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": [
        {**_entry(tok, e.token_id, e.logprob),
         "top_logprobs": [_entry(tok, t, lp) for t, lp in e.top]}
        for e in entries]}


def completion_logprobs(tok: Tokenizer, entries: Sequence[TokenLogprob], offset: int = 0
                        ) -> dict[str, Any]:
    """``offset``: characters of text before the first token (the text already sent)."""
    tokens, offsets = [], []
    for e in entries:
        text = token_text(tok, e.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens,
            "token_logprobs": [max(e.logprob, -9999.0) for e in entries],
            "top_logprobs": [{token_text(tok, t): max(lp, -9999.0) for t, lp in e.top}
                             for e in entries],
            "text_offset": offsets}
