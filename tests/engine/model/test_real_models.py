"""The trained checkpoints against transformers: what ``kvengine fetch-model`` installs runs
in the engine with transformers' greedy tokens (float32), cold and — in a second process —
from an exact-mode store hit, on more than 2,000 tokens of real text (longer than Gemma 3's
512-token window, so its sliding layers slide)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.model.catalog import CATALOG
from engine.model.tokenizer import Tokenizer
from tests.engine.model.real_models import real_model, real_text

PROMPT_CHARS = 9000
NEW_TOKENS = 24
BLOCK = 64
NEAR_TIE = 0.05  # float32 logit gap under which two engines may pick either token


@pytest.fixture(scope="module", params=sorted(CATALOG))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[str, Path, Path, list[int]]:
    path = real_model(request.param)
    prompt = tmp_path_factory.mktemp("prompts") / f"{request.param}.txt"
    prompt.write_text(real_text(PROMPT_CHARS), encoding="utf-8")
    ids = Tokenizer.from_dir(path).encode(prompt.read_text(encoding="utf-8"))
    assert len(ids) > 2000
    return request.param, path, prompt, ids


def _generate(path: Path, prompt: Path, store: Path) -> dict:  # type: ignore[type-arg]
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli", "generate", "--model", str(path), "--prompt-file",
         str(prompt), "--dtype", "float32", "--max-new-tokens", str(NEW_TOKENS),
         "--cache-all-layers", "--kv-store", f"embedded:{store}", "--json"],
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    turn: dict = json.loads(proc.stdout)["turns"][0]  # type: ignore[type-arg]
    return turn


def _transformers_logits(path: Path, ids: list[int], new: list[int]) -> torch.Tensor:
    """transformers' next-token logits at each of ``new``'s positions, teacher-forced."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        out = ref(torch.tensor([ids + new[:-1]]), logits_to_keep=len(new))
    return out.logits[0].float()


def _assert_greedy(ours: list[int], ref_logits: torch.Tensor, what: str) -> None:
    """Each engine token is transformers' argmax, up to the first near-tie (where both
    tokens are within ``NEAR_TIE`` of each other); the comparison stops there."""
    for i, token in enumerate(ours):
        best = int(ref_logits[i].argmax())
        if token != best:
            gap = float(ref_logits[i, best] - ref_logits[i, token])
            assert gap < NEAR_TIE, (f"{what}: step {i} chose {token}, transformers {best} "
                                    f"(logit gap {gap:.4f})")
            return


def test_cold_and_store_hit_in_a_second_process_match_transformers(
        case: tuple[str, Path, Path, list[int]], tmp_path: Path) -> None:
    name, path, prompt, ids = case
    store = tmp_path / "store"
    cold = _generate(path, prompt, store)
    assert cold["prompt_tokens"] == len(ids) and cold["computed_tokens"] == len(ids)
    warm = _generate(path, prompt, store)
    # A fresh process: empty pool and DRAM, so every hit is a block the first one stored.
    assert warm["hit_tokens"]["ssd"] + warm["hit_tokens"]["dram"] == (len(ids) - 1) // BLOCK * BLOCK
    assert warm["computed_tokens"] < BLOCK + 1
    ref = _transformers_logits(path, ids, cold["token_ids"])
    _assert_greedy(cold["token_ids"], ref, f"{name} cold")
    _assert_greedy(warm["token_ids"], ref if warm["token_ids"] == cold["token_ids"]
                   else _transformers_logits(path, ids, warm["token_ids"]), f"{name} store hit")
    assert warm["token_ids"] == cold["token_ids"]
