"""Agent-style sessions for engine tests, and how two runs of one session are compared.

Two conversations share a long opening (a system-prompt-like header) and then alternate
turns of tool output; the comparison follows the near-tie rule (``assert_greedy_close``):
greedy tokens agree up to the first position where they differ, and there each run's token
is in the other's top-k. A session's later turns carry earlier answers, so the comparison
stops at the first difference.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

import torch

from engine.connector.store_link import NullStoreLink, StoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.entrypoints.generate import TurnResult, play
from engine.entrypoints.session import Conversation, SessionTurn
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel
from tests.engine.model.compare import assert_greedy_close, assert_logits_close

WORDS = ("block", "chain", "tier", "pool", "token", "prefix", "store", "commit", "load",
         "evict", "touch", "lease", "slab", "index", "batch", "turn", "agent", "tool")
PARAMS = SamplingParams(max_new_tokens=8)


def agent_session(turns_each: int = 3, header_words: int = 100, turn_words: int = 30,
                  seed: int = 0) -> list[SessionTurn]:
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    header = "System: you are a coding agent. Context follows.\n" + words(header_words)
    out = []
    for t in range(turns_each):
        for name in ("a", "b"):
            text = (f"{header}\nTask for {name}: {words(8)}" if t == 0
                    else f"Tool output for {name}, step {t}: {words(turn_words)}")
            out.append(SessionTurn(session=name, user=text))
    return out


def write_session_file(path: Path, turns: list[SessionTurn]) -> Path:
    path.write_text("".join(json.dumps({"session": t.session, "user": t.user}) + "\n"
                            for t in turns))
    return path


class Recorded:
    """One run of a session: its turns and the logits of every sampled step."""

    def __init__(self) -> None:
        self.turns: list[TurnResult] = []
        self._logits: dict[int, list[torch.Tensor]] = defaultdict(list)

    def observe(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        for seq, row in zip(seqs, logits, strict=True):
            self._logits[seq.seq_id].append(row.detach().float().clone())

    def logits(self) -> list[torch.Tensor]:
        """Per turn, ``[new tokens, vocab]`` (turns ran one after another)."""
        return [torch.stack(rows) for _, rows in sorted(self._logits.items())]


def engine_for(lm: LoadedModel, link: StoreLink | None = None, pool_tokens: int = 832,
               budget: int = 256) -> LLMEngine:
    config = EngineConfig(pool_tokens=pool_tokens, max_batched_tokens=budget,
                          attention_backend="torch")
    link = link or NullStoreLink(engine_namespace(lm.spec, config.block_tokens))
    return LLMEngine(lm.model, config, link)


def play_recorded(engine: LLMEngine, lm: LoadedModel, turns: list[SessionTurn],
                  on_turn=None) -> Recorded:  # type: ignore[no-untyped-def]
    rec = Recorded()
    engine.runner.logits_observers.append(rec.observe)
    rec.turns = play(engine, lm.tokenizer, turns, PARAMS, on_turn=on_turn)
    engine.check_integrity()
    return rec


def play_uncached(lm: LoadedModel, turns: list[SessionTurn]) -> Recorded:
    """The reference: no prefix caching at all (a fresh engine, hence pool, per turn)."""
    rec = Recorded()
    eos = lm.spec.eos_token_ids
    conversations: dict[str, Conversation] = {}
    for turn in turns:
        conv = conversations.setdefault(turn.session, Conversation(lm.tokenizer, eos))
        ids = conv.next_prompt(turn.user)
        with engine_for(lm, pool_tokens=8192) as eng:
            eng.runner.logits_observers.append(rec.observe)
            (seq,) = eng.generate([ids], PARAMS)
        rec.turns.append(TurnResult.of(seq, turn.session, conv.record_answer(seq.output_ids)))
    return rec


def assert_same_session(ours: Recorded, ref: Recorded, what: str) -> int:
    """Near-tie comparison turn by turn; returns how many turns agreed completely."""
    ours_logits, ref_logits = ours.logits(), ref.logits()
    for i, (a, b) in enumerate(zip(ours.turns, ref.turns, strict=True)):
        assert a.prompt_tokens == b.prompt_tokens, f"{what}: turn {i} prompt differs"
        agreed = assert_greedy_close(a.token_ids, ours_logits[i], b.token_ids, ref_logits[i],
                                     f"{what} turn {i}")
        upto = max(1, agreed)
        assert_logits_close(ours_logits[i][:upto], ref_logits[i][:upto], f"{what} turn {i}")
        if agreed < len(b.token_ids):
            return i
    return len(ref.turns)
