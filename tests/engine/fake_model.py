"""A stand-in model for scheduler tests that need thousands of steps: it honours the step
contract (writes every token's K/V at its slot, returns logits for ``logits_indices``) with
K/V and next tokens that are a pure function of the token and its position, so a test can
check any pool block's bytes and any output without running a network."""

from __future__ import annotations

import torch

import kernels
from engine.core.forward_batch import ForwardBatch
from engine.kv.cache import KVCache
from engine.model.base import CausalLM
from engine.model.spec import ModelSpec

VOCAB = 97


def fake_spec(
    layers: int = 2,
    kv_heads: int = 1,
    head_dim: int = 4,
    context: int = 4096,
    eos: tuple[int, ...] = (),
    windows: tuple[int | None, ...] | None = None,
) -> ModelSpec:
    """``windows``: each layer's sliding window (None: full attention; the fake model
    ignores them, the replay policy and the store's namespaces do not)."""
    return ModelSpec(
        model_id="fake",
        name="fake",
        architecture="Fake",
        num_layers=layers,
        hidden_size=8,
        num_heads=2,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=VOCAB,
        max_context_tokens=context,
        dtype=torch.float32,
        layer_windows=(None,) * layers if windows is None else windows,
        eos_token_ids=eos,
        revision="fake-r1",
    )


def kv_value(token: torch.Tensor, pos: torch.Tensor, layer: int) -> torch.Tensor:
    return (token.float() * 1000 + pos.float()) * (layer + 1)


def next_token(token: int, pos: int) -> int:
    return (token * 31 + pos * 7 + 3) % VOCAB


class FakeModel(CausalLM):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device

    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        s = self.spec
        for layer in range(s.num_layers):
            val = kv_value(batch.input_ids, batch.positions, layer)
            k = val[:, None, None].expand(-1, s.num_kv_heads, s.head_dim).contiguous()
            g = batch.kv_group(layer)  # a hybrid pool: sliding groups write their own pages
            slots = batch.slot_mapping if g == 0 else batch.group_slot_mappings[g - 1]
            kernels.write_kv_slots(k, -k, kv.k[layer], kv.v[layer], slots,
                                   backend=batch.backend)
        rows = batch.logits_indices
        logits = torch.zeros(len(rows), s.vocab_size)
        for i, r in enumerate(rows.tolist()):
            tok = next_token(int(batch.input_ids[r]), int(batch.positions[r]))
            logits[i, tok] = 1.0
        return logits


def expected_block(tokens: list[int], block: int, bt: int, layers: int) -> torch.Tensor:
    """K of chain block ``block`` in every layer: ``[layers, bt]``."""
    t = torch.tensor(tokens[block * bt : (block + 1) * bt])
    pos = torch.arange(block * bt, (block + 1) * bt)
    return torch.stack([kv_value(t, pos, layer) for layer in range(layers)])


def greedy_continuation(prompt: list[int], n: int) -> list[int]:
    out, toks = [], list(prompt)
    for _ in range(n):
        t = next_token(toks[-1], len(toks) - 1)
        out.append(t)
        toks.append(t)
    return out
