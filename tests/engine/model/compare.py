"""How engine outputs are compared with transformers'.

Logits: float32 within ``ATOL``/``RTOL``. Greedy tokens: as vLLM's ``check_logprobs_close``,
they must agree up to the first position where they differ, and there each side's token
must be in the other's top ``TOP_K`` (a near-tie of random weights); comparison stops
there.
"""

from __future__ import annotations

import torch

ATOL = 1e-4
RTOL = 1e-4
TOP_K = 5


def assert_logits_close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(ours.float(), ref.float(), atol=ATOL, rtol=RTOL,
                               msg=lambda m: f"{what}: {m}")


def assert_greedy_close(
    ours: list[int], ours_logits: torch.Tensor, ref: list[int], ref_logits: torch.Tensor,
    what: str,
) -> int:
    """Returns how many leading tokens agree."""
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a != b:
            ours_top = ours_logits[i].topk(TOP_K).indices.tolist()
            ref_top = ref_logits[i].topk(TOP_K).indices.tolist()
            assert a in ref_top and b in ours_top, (
                f"{what}: step {i} chose {a} (ours) vs {b} (transformers); top-{TOP_K}: "
                f"{ours_top} vs {ref_top}"
            )
            return i
    return len(ours)
