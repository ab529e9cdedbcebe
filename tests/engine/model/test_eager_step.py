"""The eager step's layer plans (``engine.model.eager_step``) give the module path's bits:
each family's layout (Llama's two norms, Qwen3's per-head q/k norms, Gemma 3's four
``1 + w`` norms, gelu-tanh and a hybrid pool), bfloat16 and float32, prefill chunks, decode
and mixed steps; a weight written in place between steps rebuilds the plans; the module
path still runs where the plans must not (a ``TorchFunctionMode``, ``KERNELS_DEBUG_CHECKS``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from engine.model import decoder as decoder_module
from engine.model import eager_step
from engine.model.loader import load_model
from engine.model.make_model import make_model
from kernels import fused
from tests.engine.model.paged import PagedHarness


class _CountingTrusted(fused.TrustedFusedOps):
    def __init__(self) -> None:
        self.calls = 0

    def rope_write(self, *a: Any) -> torch.Tensor:
        self.calls += 1
        return super().rope_write(*a)


def _run(model: Any, prompts: dict[str, list[int]], steps: int) -> torch.Tensor:
    """Two sequences: chunked prefills (one step mixes a chunk with a decode), then decode
    steps of both; every step's logits, concatenated."""
    h = PagedHarness(model, num_blocks=48, block_tokens=16)
    for name, p in prompts.items():
        h.add(name, p)
    a, b = prompts["a"], prompts["b"]
    out = [h.step(prefill=[("a", 30)])["a"]]
    out.append(h.step(prefill=[("a", len(a) - 30)])["a"])
    h.append("a", int(out[-1][-1].argmax()))
    mixed = h.step(prefill=[("b", len(b))], decode=["a"])
    out += [mixed["b"], mixed["a"]]
    h.append("a", int(mixed["a"][-1].argmax()))
    h.append("b", int(mixed["b"][-1].argmax()))
    for _ in range(steps):
        got = h.step(decode=["a", "b"])
        for name in ("a", "b"):
            out.append(got[name])
            h.append(name, int(got[name][-1].argmax()))
    return torch.cat([o.reshape(-1, o.shape[-1]) for o in out])


def _layer_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    forward = decoder_module.DecoderLayer.forward

    def counted(self: Any, *a: Any, **kw: Any) -> Any:
        calls[0] += 1
        return forward(self, *a, **kw)

    monkeypatch.setattr(decoder_module.DecoderLayer, "forward", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch,hybrid", [("llama", False), ("qwen3", False), ("gemma3", True)])
def test_plans_give_the_module_paths_bits(tmp_path: Path, arch: str, hybrid: bool,
                                          dtype: torch.dtype,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_model(arch, "tiny", tmp_path / "m", hybrid=hybrid, seed=3).path
    lm = load_model(path, dtype=dtype)
    enc = lm.tokenizer.encode_chat
    prompts = {"a": enc([{"role": "user", "content": "word " * 40}]),
               "b": enc([{"role": "user", "content": "other " * 25}])}
    calls = _layer_calls(monkeypatch)
    counting = _CountingTrusted()
    if fused.TRUSTED_OPS is not None:
        monkeypatch.setattr(eager_step, "TRUSTED_OPS", counting)
    planned = _run(lm.model, prompts, 6)
    assert calls[0] == 0  # every step ran on the plans
    assert lm.model.eager.rebuilds == 1
    if fused.TRUSTED_OPS is not None:
        assert counting.calls > 0  # and the fused ops without their per-call checks
    monkeypatch.setenv("KERNELS_DEBUG_CHECKS", "1")  # the module path, every check on
    modules = _run(lm.model, prompts, 6)
    assert calls[0] > 0
    assert torch.equal(planned, modules)


def test_a_weight_written_in_place_rebuilds_the_plans(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_model("llama", "tiny", tmp_path / "m", seed=4).path
    lm = load_model(path, dtype=torch.bfloat16)
    prompts = {"a": list(range(3, 60)), "b": list(range(7, 40))}
    before = _run(lm.model, prompts, 2)
    layer = lm.model.model.layers[0]
    with torch.no_grad():
        layer.mlp.down_proj.weight.mul_(-1.5)  # type: ignore[union-attr, operator]
        layer.input_layernorm.weight.add_(0.25)  # type: ignore[union-attr, operator]
    after = _run(lm.model, prompts, 2)
    assert lm.model.eager.rebuilds == 2
    assert not torch.equal(before, after)
    monkeypatch.setenv("KERNELS_DEBUG_CHECKS", "1")
    assert torch.equal(after, _run(lm.model, prompts, 2))


def test_a_torch_function_mode_keeps_the_module_path(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic mode intercepts F.linear with a TorchFunctionMode: the plans' direct
    kernel calls would bypass it."""
    path = make_model("llama", "tiny", tmp_path / "m", seed=4).path
    lm = load_model(path, dtype=torch.float32)
    seen: list[object] = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            seen.append(func)
            return func(*args, **(kwargs or {}))

    calls = _layer_calls(monkeypatch)
    with Watch():
        _run(lm.model, {"a": list(range(3, 50)), "b": list(range(5, 30))}, 1)
    assert calls[0] > 0 and torch.nn.functional.linear in seen
