"""transformers' ``sliding_window = W`` hides key ``j`` from query ``i`` unless
``i − j < W``; the engine passes ``W`` unchanged as the kernels' ``window``. The reference
agrees with exactly that window and measurably disagrees with ``W ± 1``, so the comparison
pins the boundary rather than passing for any nearby value."""

from __future__ import annotations

import pytest
import torch

from engine.model import load_model
from engine.model.attention import Attention
from tests.engine.model.compare import ATOL, assert_logits_close
from tests.engine.model.hf_checkpoints import load_reference
from tests.engine.model.paged import PagedHarness


def _run(lm, tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    h = PagedHarness(lm.model, block_tokens=16)
    h.add("a", tokens)
    return h.prefill("a", [13, len(tokens) - 13])


@pytest.mark.parametrize("case", ["mistral_window", "qwen2_hybrid", "gemma3_window"])
def test_window_boundary(hf_checkpoint, case: str) -> None:  # type: ignore[no-untyped-def]
    path = hf_checkpoint(case)
    lm, ref = load_model(path), load_reference(path)
    tokens = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(9)).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0]
    assert lm.spec.layer_windows[0] == 8 == ref.config.sliding_window
    assert_logits_close(_run(lm, tokens), want, case)
    layers = [m for m in lm.model.modules() if isinstance(m, Attention) and m.window]
    for delta in (-1, 1):
        for attn in layers:
            attn.window = 8 + delta
        off = (_run(lm, tokens) - want).abs().max().item()
        assert off > 100 * ATOL, f"window {8 + delta} is indistinguishable ({off})"
    for attn in layers:
        attn.window = 8
