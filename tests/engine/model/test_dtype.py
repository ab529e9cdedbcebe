"""``dtype`` override: a float32 checkpoint served in bfloat16 keeps activations and KV in
bfloat16 and stays close to transformers running the same weights in bfloat16 (Gemma 3
too: its embedding scale is rounded to bfloat16 and its norms cast after scaling, as
transformers does)."""

from __future__ import annotations

import pytest
import torch

from engine.model import load_model
from tests.engine.model.hf_checkpoints import load_reference
from tests.engine.model.paged import PagedHarness


@pytest.mark.parametrize("case", ["qwen3_hybrid_head_dim", "gemma3_hybrid_softcap"])
def test_bfloat16_override(hf_checkpoint, case: str) -> None:  # type: ignore[no-untyped-def]
    path = hf_checkpoint(case)
    lm = load_model(path, dtype="bfloat16")
    assert lm.spec.dtype == torch.bfloat16
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    ref = load_reference(path).to(torch.bfloat16)
    tokens = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.no_grad():
        want = ref(torch.tensor([tokens])).logits[0].float()
    h = PagedHarness(lm.model, block_tokens=16)
    assert h.kv.storage.dtype == torch.bfloat16
    h.add("a", tokens)
    got = h.prefill("a", [40])
    assert got.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: a few units of its epsilon on logits of ~1.
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agree >= 0.9
