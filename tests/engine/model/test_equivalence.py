"""The engine's model against transformers on checkpoints transformers wrote.

Every architecture (Llama, Mistral, Qwen2, Qwen3, Gemma 3), tied and untied embeddings,
derived and explicit head_dim, GQA, RoPE default/linear (legacy ``rope_scaling``)/llama3,
biases, Qwen3's q/k norms, sharded safetensors, and sliding windows shorter than the prompt
(Mistral on every layer, Qwen2/Qwen3/Gemma 3 alternating through ``layer_types``, via
``max_window_layers`` or Gemma's ``sliding_window_pattern``). Gemma 3 also with both RoPE
forms (per-layer-type ``rope_parameters``; legacy ``rope_theta`` + ``rope_local_base_freq`` +
``rope_scaling``) and a final logit soft-cap. The
model runs through paged KV in shuffled pool blocks: prefill in uneven chunks, decode
steps, and two sequences of different lengths batched together.
"""

from __future__ import annotations

import pytest
import torch

from engine.model import load_model
from tests.engine.model.compare import assert_greedy_close, assert_logits_close
from tests.engine.model.hf_checkpoints import CASES, load_reference
from tests.engine.model.paged import PagedHarness

PROMPT_TOKENS = 50
NEW_TOKENS = 12


def _tokens(n: int, seed: int, vocab: int = 256) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _ref_logits(ref: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0].float()


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest, hf_checkpoint):  # type: ignore[no-untyped-def]
    path = hf_checkpoint(request.param)
    return request.param, load_model(path, dtype="float32"), load_reference(path)


def test_windows_shorter_than_the_prompt(pair) -> None:  # type: ignore[no-untyped-def]
    name, lm, _ = pair
    windows = [w for w in lm.spec.layer_windows if w is not None]
    if "window" in name or "hybrid" in name:
        assert windows and max(windows) < PROMPT_TOKENS
        assert ("hybrid" not in name) or None in lm.spec.layer_windows


def test_chunked_prefill_logits_match(pair) -> None:  # type: ignore[no-untyped-def]
    name, lm, ref = pair
    tokens = _tokens(PROMPT_TOKENS, seed=1)
    h = PagedHarness(lm.model, block_tokens=16)
    h.add("a", tokens)
    ours = h.prefill("a", [7, 16, 1, 26])  # chunks straddle block edges and windows
    assert_logits_close(ours, _ref_logits(ref, tokens), f"{name} prefill")


def test_greedy_decode_matches_generate(pair) -> None:  # type: ignore[no-untyped-def]
    name, lm, ref = pair
    prompt = _tokens(PROMPT_TOKENS - 10, seed=2)
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                           max_new_tokens=NEW_TOKENS, do_sample=False,
                           output_logits=True, return_dict_in_generate=True,
                           eos_token_id=None, pad_token_id=0)
    ref_tokens = out.sequences[0, len(prompt):].tolist()
    ref_logits = torch.stack([x[0] for x in out.logits]).float()
    h = PagedHarness(lm.model, block_tokens=16)
    h.add("a", prompt)
    last = h.prefill("a", [len(prompt)], all_rows=False)[-1]
    ours, ours_logits = h.greedy("a", last, NEW_TOKENS)
    agreed = assert_greedy_close(ours, ours_logits, ref_tokens, ref_logits, name)
    # Up to the first near-tie both sides computed from the same context: same logits.
    assert_logits_close(ours_logits[: agreed + 1], ref_logits[: agreed + 1], f"{name} decode")


def test_ragged_batch_of_two_sequences(pair) -> None:  # type: ignore[no-untyped-def]
    """Prefills of two lengths in one step, a step mixing one's decode with the other's
    chunk, then both decoding together; teacher-forced so every row has a reference."""
    name, lm, ref = pair
    a, b = _tokens(45, seed=3), _tokens(30, seed=4)
    h = PagedHarness(lm.model, block_tokens=16, seed=5)
    h.add("a", a[:40])
    h.add("b", b[:20])
    got: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    out = h.step(prefill=[("a", 40), ("b", 13)], all_rows=True)
    got["a"].append(out["a"])
    got["b"].append(out["b"])
    h.append("a", a[40])
    out = h.step(prefill=[("b", 7)], decode=["a"], all_rows=True)
    got["a"].append(out["a"])
    got["b"].append(out["b"])
    for i in range(4):
        h.append("a", a[41 + i])
        h.append("b", b[20 + i])
        out = h.step(decode=["b", "a"])
        got["a"].append(out["a"])
        got["b"].append(out["b"])
    assert_logits_close(torch.cat(got["a"]), _ref_logits(ref, a[:45]), f"{name} ragged a")
    assert_logits_close(torch.cat(got["b"]), _ref_logits(ref, b[:24]), f"{name} ragged b")
