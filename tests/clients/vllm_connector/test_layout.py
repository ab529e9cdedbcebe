"""Paged KV <-> tokens through a measured permutation, with cache writers like vLLM's CPU
kernels (K transposed per block, V plain; both interleaved in pairs as AMX packs them)."""

from __future__ import annotations

import pytest
import torch

from clients.vllm_connector.layout import (
    LayoutError,
    probe_layout,
    read_tokens,
    token_slots,
    write_tokens,
)


def transposed_k(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor,
                 slots: torch.Tensor) -> None:
    nb, heads, bs, two_d = kv.shape
    d = two_d // 2
    area = kv.view(nb, heads, 2 * bs * d)
    for i, s in enumerate(slots.tolist()):
        b, t = divmod(s, bs)
        for h in range(heads):
            area[b, h, torch.arange(d) * bs + t] = key[i, h]  # K as [d][bs]
            area[b, h, bs * d + t * d : bs * d + (t + 1) * d] = value[i, h]


def pair_packed(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor,
                slots: torch.Tensor) -> None:
    nb, heads, bs, two_d = kv.shape
    d = two_d // 2
    area = kv.view(nb, heads, 2 * bs * d)
    for i, s in enumerate(slots.tolist()):
        b, t = divmod(s, bs)
        for h in range(heads):
            for j in range(d):  # K as [d/2][bs][2], V as [bs/2][d][2]
                area[b, h, (j // 2) * bs * 2 + t * 2 + j % 2] = key[i, h, j]
                area[b, h, bs * d + (t // 2) * d * 2 + j * 2 + t % 2] = value[i, h, j]


@pytest.mark.parametrize("writer", [transposed_k, pair_packed])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tokens_round_trip_through_any_block_table(writer, dtype) -> None:
    heads, dim, bs = 2, 8, 16
    layout = probe_layout(writer, bs, heads, dim, dtype)
    kv = torch.zeros(6, heads, bs, 2 * dim, dtype=dtype)
    n = 70
    key, value = torch.randn(n, heads, dim).to(dtype), torch.randn(n, heads, dim).to(dtype)
    table = [4, 0, 5, 2, 1]
    blocks, offsets = token_slots(table, 0, n, bs)
    writer(key, value, kv, blocks * bs + offsets)  # what vLLM's forward writes
    index = layout.flat_index(blocks, offsets)
    got = read_tokens(kv, index)
    assert torch.equal(got[0], key) and torch.equal(got[1], value)
    again = torch.zeros_like(kv)
    write_tokens(again, index, torch.stack((key, value)))
    assert torch.equal(again, kv)


def test_a_write_that_is_not_a_permutation_is_refused() -> None:
    def scaled(key, value, kv, slots):
        pair_packed(key * 2, value, kv, slots)

    with pytest.raises(LayoutError):
        probe_layout(scaled, 16, 1, 8, torch.float32)
    with pytest.raises(LayoutError):
        probe_layout(pair_packed, 16, 1, 8, torch.float8_e4m3fn)
