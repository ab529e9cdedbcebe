"""The incremental detokenizer on the real tokenizers: streamed in any chunks, the text is
the full decode, and each step decodes a bounded window (O(n) for a stream, not O(n²))."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.catalog import CATALOG
from engine.model.tokenizer import Tokenizer
from engine.server.text_stream import IncrementalDecoder, TextStream
from tests.engine.model.real_models import real_model, real_text


@pytest.fixture(scope="module", params=sorted(CATALOG))
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return Tokenizer.from_dir(real_model(request.param))


class Counting:
    """A tokenizer that records the length of every decode it is asked for."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.sizes: list[int] = []

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.sizes.append(len(ids))
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def _stream(tok: Tokenizer, ids: list[int], splits: list[int]) -> str:
    ts = TextStream(tok)
    sent, pos, i = "", 0, 0
    while pos < len(ids):
        n = splits[i % len(splits)]
        sent += ts.add(ids[pos : pos + n])
        pos, i = pos + n, i + 1
    return sent + ts.finish()


@settings(max_examples=30, deadline=None)
@given(data=st.data(), splits=st.lists(st.integers(1, 3), min_size=1, max_size=5))
def test_streamed_real_text_is_the_full_decode(tokenizer: Tokenizer, data: st.DataObject,
                                               splits: list[int]) -> None:
    text = real_text(3000)
    start = data.draw(st.integers(0, 2500))
    ids = list(tokenizer.encode(text[start : start + 400]))
    assert _stream(tokenizer, ids, splits) == tokenizer.decode(ids)


def _stream_by_full_decodes(tok: Tokenizer, ids: list[int], splits: list[int]) -> str:
    """The quadratic definition the stream replaced: decode every token so far at each
    step, send what grew unless it ends in U+FFFD."""
    sent, pos, i = "", 0, 0
    while pos < len(ids):
        pos, i = pos + splits[i % len(splits)], i + 1
        text = tok.decode(ids[:pos])
        if not text.endswith("\ufffd") and len(text) > len(sent):
            sent += text[len(sent):]
    return sent + tok.decode(ids)[len(sent):]


@settings(max_examples=30, deadline=None)
@given(ids=st.lists(st.integers(0, 8000), min_size=1, max_size=60),
       splits=st.lists(st.integers(1, 3), min_size=1, max_size=5))
def test_random_tokens_stream_as_full_decodes_did(tokenizer: Tokenizer, ids: list[int],
                                                  splits: list[int]) -> None:
    # Arbitrary ids: cut UTF-8 sequences, special tokens, pieces out of order (where a
    # byte-fallback piece decodes differently alone, neither stream can take text back).
    assert _stream(tokenizer, ids, splits) == _stream_by_full_decodes(tokenizer, ids, splits)


def test_each_step_decodes_a_bounded_window(tokenizer: Tokenizer) -> None:
    ids = list(tokenizer.encode(real_text(6000)))[:1200]
    counting = Counting(tokenizer)
    dec = IncrementalDecoder(counting)
    for t in ids:
        dec.add([t])
    assert dec.text == tokenizer.decode(ids)
    assert max(counting.sizes) <= 16  # a decode of every token so far would reach 1,200
