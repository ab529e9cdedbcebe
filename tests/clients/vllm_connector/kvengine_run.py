"""``kvengine`` in this process, float32, for the across-engines checks: one prompt at a time
against a store URL (``none``, ``embedded:DIR``), its greedy tokens and its store hit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.connector.stores import StoreOptions, open_store_link
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel, load_model

MAX_NEW_TOKENS = 8  # as the vLLM runs


@dataclass(frozen=True)
class Answer:
    tokens: list[int]
    hit_tokens: int  # from the store (dram + ssd)


class KvEngine:
    def __init__(self, model_dir: Path) -> None:
        self.lm: LoadedModel = load_model(model_dir, dtype="float32")

    def run(self, prompt: list[int], store: str) -> Answer:
        spec = self.lm.spec
        link = open_store_link(store, lambda tenant: engine_namespace(spec, 64, tenant),
                               StoreOptions(dram_bytes=256 << 20, ssd_capacity_bytes=2 << 30))
        with LLMEngine(self.lm.model, EngineConfig(pool_tokens=4096), link) as eng:
            (seq,) = eng.generate([prompt], SamplingParams(max_new_tokens=MAX_NEW_TOKENS))
            eng.drain(60.0)
        hits = seq.stats.hit_tokens
        return Answer(tokens=list(seq.output_ids),
                      hit_tokens=hits.get("dram", 0) + hits.get("ssd", 0))


def agreement(a: list[int], b: list[int]) -> int:
    """Leading tokens two greedy answers share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
