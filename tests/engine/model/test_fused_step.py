"""A model step through the fused C ops (``kernels.fused``) gives the torch forms' greedy
tokens, on each family's layer layout (Llama's two norms, Qwen3's per-head q/k norms,
Gemma 3's four ``1 + w`` norms, gelu-tanh and hybrid windows), and really runs the C ops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model.loader import load_model
from engine.model.make_model import make_model
from kernels import fused
from tests.engine.model.compare import assert_logits_close
from tests.engine.model.paged import PagedHarness

pytestmark = pytest.mark.skipif("c" not in fused.FUSED_OPS,
                                reason=f"kernels._fused is not built: {fused.IMPORT_ERROR}")


class _Counting(fused.CompiledFusedOps):
    """The C ops, counting the calls of each op."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def rms_norm(self, *a: Any) -> torch.Tensor:
        self._count("rms_norm")
        return super().rms_norm(*a)

    def add_rms_norm(self, *a: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self._count("add_rms_norm")
        return super().add_rms_norm(*a)

    def gated_act(self, *a: Any) -> torch.Tensor:
        self._count("gated_act")
        return super().gated_act(*a)

    def rope_write(self, *a: Any) -> torch.Tensor:
        self._count("rope_write")
        return super().rope_write(*a)


def _run(model: Any, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    h = PagedHarness(model, num_blocks=32, block_tokens=16)
    h.add("a", prompt)
    first = h.prefill("a", [40, len(prompt) - 40])
    tokens, logits = h.greedy("a", first[-1], steps)
    return tokens, torch.cat([first, logits])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch,hybrid", [("llama", False), ("qwen3", False), ("gemma3", True)])
def test_fused_step_gives_the_torch_forms_tokens(tmp_path: Path, arch: str, hybrid: bool,
                                                 dtype: torch.dtype,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_model(arch, "tiny", tmp_path / "m", hybrid=hybrid, seed=5).path
    lm = load_model(path, dtype=dtype)
    prompt = lm.tokenizer.encode_chat([{"role": "user", "content": "word " * 60}])
    counting = _Counting()
    monkeypatch.setattr(fused, "_COMPILED_OPS", counting)
    got_tokens, got_logits = _run(lm.model, prompt, 12)
    assert counting.calls.get("rope_write", 0) > 0 and counting.calls.get("gated_act", 0) > 0
    assert counting.calls.get("add_rms_norm", 0) > 0
    monkeypatch.setenv("KERNELS_FUSED", "torch")
    before = dict(counting.calls)
    want_tokens, want_logits = _run(lm.model, prompt, 12)
    assert counting.calls == before  # the torch forms ran
    assert got_tokens == want_tokens
    assert_logits_close(got_logits, want_logits, f"{arch} fused vs torch forms")
