"""llguidance behind the engine: one tokenizer description built once per model, a grammar
checked before a request is queued (a bad schema is the client's 400, not a failed step),
and a matcher per sequence."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from engine.errors import EngineInputError
from engine.structured.spec import ConstraintSpec

MAX_CACHED_GRAMMARS = 256  # compiled grammar texts kept (agents resend the same tools)


class GrammarBackend:
    def __init__(self, tokenizer_json: str, vocab_size: int, eos_token_id: int) -> None:
        """``vocab_size``: the model's logits width (it may exceed the tokenizer's)."""
        import llguidance

        self._llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                eos_token=eos_token_id)
        self.vocab_size = vocab_size
        self.executor = llguidance.LLExecutor()
        self._grammar = lru_cache(MAX_CACHED_GRAMMARS)(self._compile)

    def _compile(self, spec: ConstraintSpec) -> str:
        try:
            grammar = spec.grammar()
        except Exception as e:  # llguidance's converters raise their own types
            raise EngineInputError(f"{spec.kind}: {e}") from None
        error = self._llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if error:
            raise EngineInputError(f"{spec.kind}: {error}")
        return grammar

    def check(self, spec: ConstraintSpec) -> None:
        """Raises ``EngineInputError`` when ``spec`` does not compile."""
        self._grammar(spec)

    def matcher(self, spec: ConstraintSpec) -> Any:
        m = self._llg.LLMatcher(self.tokenizer, self._grammar(spec))
        if m.is_error():
            raise EngineInputError(f"{spec.kind}: {m.get_error()}")
        return m
